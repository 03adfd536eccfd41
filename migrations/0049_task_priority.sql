-- Task priority (issue 38, item 1: a person re-prioritises tasks).
--
-- tasks.priority is a rank, 0..3, shown on the wire as a word:
--   0 low, 1 normal (the default), 2 high, 3 urgent.
-- Four words read better for a language model than a bare number (no guess
-- whether 1 is high or low); a smallint keeps "higher first" one ORDER BY.
-- Rust (store/tasks/priority.rs) maps words to ranks; nothing else does.
--
-- claim_next_task takes the highest priority first, then the oldest
-- (created_at, seq), as before. The partial index on open-or-claimed tasks
-- is rebuilt in that order, so the claim stays a walk of one team's
-- claimable entries from the front, stopping at the first ready row: the
-- plan of 0004/0032 with priority leading the order. list_tasks open/claimed
-- list in the same order (the claimed-only index likewise).

ALTER TABLE tasks
    ADD COLUMN priority smallint NOT NULL DEFAULT 1 CHECK (priority BETWEEN 0 AND 3);

-- A change of priority is a `priority_changed` event in the task's history
-- (and, through the trigger of 0025, a `task.priority_changed` webhook).
ALTER TABLE task_events
    DROP CONSTRAINT task_events_kind_check,
    ADD CONSTRAINT task_events_kind_check
        CHECK (kind IN ('created', 'claimed', 'renewed', 'released', 'completed', 'cancelled',
                        'dependencies_changed', 'priority_changed'));

DROP INDEX tasks_claimable;
CREATE INDEX tasks_claimable ON tasks (team_id, priority DESC, created_at, seq)
    WHERE status IN ('open', 'claimed');
DROP INDEX tasks_claimed_queue;
CREATE INDEX tasks_claimed_queue ON tasks (team_id, priority DESC, created_at, seq)
    WHERE status = 'claimed';

-- task_rows of 0032 with `priority` appended (a view's columns may only
-- grow at the end).
CREATE OR REPLACE VIEW task_rows AS
SELECT t.team_id, t.seq, t.id, t.key, t.title, t.description, t.metadata, t.status,
       (t.status = 'claimed' AND t.lease_expires_at <= now()) AS lapsed,
       t.holder_agent_id,
       (SELECT a.name FROM agents a WHERE a.team_id = t.team_id AND a.id = t.holder_agent_id)
           AS holder_agent,
       t.holder_session, t.claimed_at, t.lease_expires_at,
       greatest(0, ceil(extract(epoch FROM t.lease_expires_at - now())))::bigint
           AS lease_seconds_left,
       t.created_by AS creator_id,
       (SELECT a.name FROM agents a WHERE a.team_id = t.team_id AND a.id = t.created_by)
           AS created_by,
       t.created_session, t.created_at, t.updated_at,
       t.completed_by AS completer_id,
       (SELECT a.name FROM agents a WHERE a.team_id = t.team_id AND a.id = t.completed_by)
           AS completed_by,
       t.completed_session, t.completed_at, t.result,
       (SELECT a.name FROM agents a WHERE a.team_id = t.team_id AND a.id = t.cancelled_by)
           AS cancelled_by,
       t.cancelled_session, t.cancelled_at, t.cancel_reason,
       ARRAY(SELECT p.key FROM task_dependencies d
               JOIN tasks p ON p.team_id = d.team_id AND p.id = d.depends_on_id
              WHERE d.team_id = t.team_id AND d.task_id = t.id ORDER BY p.seq) AS depends_on,
       ARRAY(SELECT p.key FROM task_dependencies d
               JOIN tasks p ON p.team_id = d.team_id AND p.id = d.depends_on_id
              WHERE d.team_id = t.team_id AND d.task_id = t.id AND p.status <> 'done'
              ORDER BY p.seq) AS blocked_by,
       ARRAY(SELECT p.key FROM task_dependencies d
               JOIN tasks p ON p.team_id = d.team_id AND p.id = d.depends_on_id
              WHERE d.team_id = t.team_id AND d.task_id = t.id AND p.status = 'cancelled'
              ORDER BY p.seq) AS blocked_by_cancelled,
       t.priority
  FROM tasks t;

-- task_row_of of 0036 with `priority` appended, as the view has it.
CREATE OR REPLACE FUNCTION task_row_of(p_task tasks)
RETURNS task_rows LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_row task_rows;
BEGIN
    SELECT p_task.team_id, p_task.seq, p_task.id, p_task.key, p_task.title,
           p_task.description, p_task.metadata, p_task.status,
           (p_task.status = 'claimed' AND p_task.lease_expires_at <= now()),
           p_task.holder_agent_id, n.holder_agent, p_task.holder_session,
           p_task.claimed_at, p_task.lease_expires_at,
           greatest(0, ceil(extract(epoch FROM p_task.lease_expires_at - now())))::bigint,
           p_task.created_by, n.created_by, p_task.created_session,
           p_task.created_at, p_task.updated_at,
           p_task.completed_by, n.completed_by, p_task.completed_session,
           p_task.completed_at, p_task.result,
           n.cancelled_by, p_task.cancelled_session, p_task.cancelled_at,
           p_task.cancel_reason,
           '{}'::text[], '{}'::text[], '{}'::text[],
           p_task.priority
      INTO v_row
      FROM (SELECT max(a.name) FILTER (WHERE a.id = p_task.holder_agent_id) AS holder_agent,
                   max(a.name) FILTER (WHERE a.id = p_task.created_by) AS created_by,
                   max(a.name) FILTER (WHERE a.id = p_task.completed_by) AS completed_by,
                   max(a.name) FILTER (WHERE a.id = p_task.cancelled_by) AS cancelled_by
              FROM agents a
             WHERE a.team_id = p_task.team_id
               AND a.id IN (p_task.holder_agent_id, p_task.created_by,
                            p_task.completed_by, p_task.cancelled_by)) n;
    IF EXISTS (SELECT 1 FROM task_dependencies d
                WHERE d.team_id = p_task.team_id AND d.task_id = p_task.id) THEN
        SELECT v.depends_on, v.blocked_by, v.blocked_by_cancelled
          INTO v_row.depends_on, v_row.blocked_by, v_row.blocked_by_cancelled
          FROM task_rows v
         WHERE v.team_id = p_task.team_id AND v.id = p_task.id;
    END IF;
    RETURN v_row;
END
$$;

-- task_claim_next of 0036: the highest priority first, then the oldest.
-- Everything else (the fence, the shared dependency lock, SKIP LOCKED, the
-- event, the answer when nothing is claimable) is 0036's.
CREATE OR REPLACE FUNCTION task_claim_next(
    p_team          uuid,
    p_agent         uuid,
    p_session       text,
    p_token         uuid,
    p_window        uuid,
    p_epoch         bigint,
    p_lease_seconds bigint)
RETURNS TABLE (refusal text, session_epoch bigint, refused_since timestamptz, declined text,
               waiting bigint, held bigint, next_expiry timestamptz, stuck bigint,
               task task_rows)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_id            uuid;
    v_prev_agent    text;
    v_prev_session  text;
    v_task          tasks;
BEGIN
    SELECT r.refusal, r.session_epoch, r.refused_since
      INTO refusal, session_epoch, refused_since
      FROM agent_write_refusal(p_team, p_agent, p_token, p_window, p_epoch, false) r;
    IF refusal IS NOT NULL THEN
        RETURN NEXT;
        RETURN;
    END IF;
    PERFORM lock_task_dependencies(p_team, false);

    WITH next AS (
        SELECT t.id, pa.name AS prev_agent, t.holder_session AS prev_session
          FROM tasks t
          LEFT JOIN agents pa ON pa.team_id = t.team_id AND pa.id = t.holder_agent_id
         WHERE t.team_id = p_team
           AND (t.status = 'open' OR (t.status = 'claimed' AND t.lease_expires_at <= now()))
           AND NOT EXISTS (
               SELECT 1 FROM task_dependencies d
                 JOIN tasks p ON p.team_id = d.team_id AND p.id = d.depends_on_id
                WHERE d.team_id = t.team_id AND d.task_id = t.id AND p.status <> 'done')
         ORDER BY t.priority DESC, t.created_at, t.seq
         LIMIT 1
           FOR NO KEY UPDATE OF t SKIP LOCKED)
    UPDATE tasks t
       SET status = 'claimed', holder_agent_id = p_agent, holder_session = p_session,
           lease_expires_at = now() + make_interval(secs => p_lease_seconds),
           claimed_at = now(), updated_at = now()
      FROM next
     WHERE t.id = next.id
    RETURNING t.id, next.prev_agent, next.prev_session
         INTO v_id, v_prev_agent, v_prev_session;

    IF v_id IS NULL THEN
        declined := 'nothing';
        SELECT count(*) FILTER (WHERE t.status = 'open' OR t.lease_expires_at <= now()),
               count(*) FILTER (WHERE t.status = 'claimed' AND t.lease_expires_at > now()),
               min(t.lease_expires_at) FILTER (WHERE t.status = 'claimed'
                                                 AND t.lease_expires_at > now()),
               count(*) FILTER (WHERE (t.status = 'open' OR t.lease_expires_at <= now())
                                  AND EXISTS (
                                      SELECT 1 FROM task_dependencies d
                                        JOIN tasks p ON p.team_id = d.team_id
                                                    AND p.id = d.depends_on_id
                                       WHERE d.team_id = t.team_id AND d.task_id = t.id
                                         AND p.status = 'cancelled'))
          INTO waiting, held, next_expiry, stuck
          FROM tasks t WHERE t.team_id = p_team AND t.status IN ('open', 'claimed');
        RETURN NEXT;
        RETURN;
    END IF;

    INSERT INTO task_events (team_id, task_id, kind, agent_id, session, detail)
    VALUES (p_team, v_id, 'claimed', p_agent, p_session,
            jsonb_build_object('lease_seconds', p_lease_seconds,
                               'lapsed_holder', task_window_address(v_prev_agent, v_prev_session),
                               'via', 'claim_next_task'));
    SELECT * INTO v_task FROM tasks t WHERE t.id = v_id;
    task := task_row_of(v_task);
    RETURN NEXT;
END
$$;
