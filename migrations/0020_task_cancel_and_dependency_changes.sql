-- Cancelling a task, and changing a waiting task's dependencies (issue 16,
-- item 6).
--
-- `cancelled` was a status from the start (0004) but nothing set it. Now
-- `cancel_task` does, for the task's creator or the window holding its live
-- lease, and the row keeps who cancelled it, when and why, as it keeps who
-- completed it: task_events may be pruned, the task row never is.
--
-- A task that depends on a cancelled one stays blocked (a cancelled task is
-- never done), so its creator may now re-point it: `set_task_dependencies`
-- replaces its dependency list. That ends 0004's "dependencies are fixed at
-- creation, so a cycle cannot be built": the store refuses a list that would
-- close a cycle, checked under a team-wide advisory lock (class 'ACSd') that
-- every dependency change takes, so two changes cannot each pass the check
-- and together close one. create_task needs no lock: a new task has no
-- dependents yet.

ALTER TABLE tasks
    ADD COLUMN cancelled_by       uuid,
    ADD COLUMN cancelled_session  text,
    ADD COLUMN cancelled_at       timestamptz,
    ADD COLUMN cancel_reason      text CHECK (octet_length(cancel_reason) BETWEEN 1 AND 4096),
    ADD FOREIGN KEY (team_id, cancelled_by) REFERENCES agents (team_id, id),
    -- One direction only: a row set to `cancelled` by hand before this
    -- migration has no canceller to name, and reads as cancelled by nobody
    -- known rather than as someone invented.
    ADD CONSTRAINT tasks_cancelled_fields_only_when_cancelled
        CHECK (cancelled_at IS NULL OR status = 'cancelled'),
    ADD CONSTRAINT tasks_cancelled_fields_together
        CHECK ((cancelled_by IS NULL) = (cancelled_at IS NULL)
               AND (cancelled_by IS NULL) = (cancelled_session IS NULL)
               AND (cancelled_by IS NULL) = (cancel_reason IS NULL));

-- The new event kind, for a change of dependencies. Every existing row
-- passed the narrower list this replaces.
ALTER TABLE task_events
    DROP CONSTRAINT task_events_kind_check,
    ADD CONSTRAINT task_events_kind_check
        CHECK (kind IN ('created', 'claimed', 'renewed', 'released', 'completed', 'cancelled',
                        'dependencies_changed'));
