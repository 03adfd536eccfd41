-- A task write does less work per call that it never needed (issue 34:
-- claim_complete), as 0037 did for the send.
--
-- Counted with callgrind on PostgreSQL 15 (instructions in the backend per
-- task_claim_next + task_change('complete'), called as the server calls
-- them, for a team without webhooks; the difference between 20 and 220 of
-- them on one connection): 3.73 M before. Two costs every claim and
-- completion paid:
--
-- - PostgreSQL parses and plans a table's CHECK constraints from their
--   catalog text for every statement that writes the table, and checks all
--   of them on every update, whichever columns it sets (migration 0015 says
--   more): `tasks` has 14, and the two UPDATEs of a claim and a completion
--   spent 1.05 M in them. The 8 that read one column (key, title,
--   description, metadata, status, result, cancel_reason, priority), and
--   task_events.kind's, become domains, whose checks the type cache keeps
--   per connection and which run only when a value is written to the
--   column. Same rules, same columns, same SQLSTATE (23514). As in 0037: the
--   domains are made without their check, the columns changed to them (no
--   rewrite: nothing to check yet; the indexes are kept, but for the two
--   partial ones on open and claimed tasks, whose predicate reads status,
--   built again), then the checks added, which validates the rows already
--   there with one scan. The 6 checks that relate two
--   columns stay table constraints. The view task_rows reads these columns,
--   and a column a view reads cannot change its type: the view is dropped
--   and made again as 0049 made it, and with it the three functions that
--   name its row type (task_row_of of 0049, task_change of 0036,
--   task_claim_next of 0049), restated below.
-- - The row trigger on task_events that queued webhook events (migration
--   0025) fired for every event, queued its call to the end of the
--   statement, started a PL/pgSQL call and only then asked whether the team
--   had a hook at all (0.08 M per claim and completion). Every writer
--   of task_events now queues the same event itself, through
--   task_event_webhook below, only when the team has a hook: task_change and
--   task_claim_next ask first and call it only then; the store's other
--   writers (creation, cancel, dependencies, priority: tasks/row.rs; the
--   bus's releases: messaging/holdings.rs) call it in the statement that
--   inserts the event. Nothing else inserts into task_events. The trigger
--   and its function are dropped. The events, their names and their data
--   are 0025's: every kind but `renewed`, `task.<kind>`, to the hooks
--   subscribed to `task`.
--
-- After: 3.12 M (-16 %). The 6 checks kept cost 0.40 M of it (without them
-- 2.73 M; merged into one check 3.11 M: what costs is reading and planning
-- their text, not how many they are). The functions' answers, refusals,
-- locks and lock order are those of 0036 and 0049.

DROP FUNCTION task_change(text, uuid, uuid, text, uuid, uuid, bigint, text, bigint, text, bigint);
DROP FUNCTION task_claim_next(uuid, uuid, text, uuid, uuid, bigint, bigint);
DROP FUNCTION task_row_of(tasks);
DROP VIEW task_rows;

CREATE DOMAIN task_key_text AS text;
CREATE DOMAIN task_title_text AS text;
CREATE DOMAIN task_description_text AS text;
CREATE DOMAIN task_metadata_object AS jsonb;
CREATE DOMAIN task_status_word AS text;
CREATE DOMAIN task_result_text AS text;
CREATE DOMAIN task_cancel_reason_text AS text;
CREATE DOMAIN task_priority_rank AS smallint;
CREATE DOMAIN task_event_kind_word AS text;

ALTER TABLE tasks
    DROP CONSTRAINT tasks_key_check,
    DROP CONSTRAINT tasks_title_check,
    DROP CONSTRAINT tasks_description_check,
    DROP CONSTRAINT tasks_metadata_check,
    DROP CONSTRAINT tasks_status_check,
    DROP CONSTRAINT tasks_result_check,
    DROP CONSTRAINT tasks_cancel_reason_check,
    DROP CONSTRAINT tasks_priority_check,
    ALTER COLUMN key TYPE task_key_text,
    ALTER COLUMN title TYPE task_title_text,
    ALTER COLUMN description TYPE task_description_text,
    ALTER COLUMN metadata TYPE task_metadata_object,
    ALTER COLUMN status TYPE task_status_word,
    ALTER COLUMN result TYPE task_result_text,
    ALTER COLUMN cancel_reason TYPE task_cancel_reason_text,
    ALTER COLUMN priority TYPE task_priority_rank;
ALTER TABLE task_events
    DROP CONSTRAINT task_events_kind_check,
    ALTER COLUMN kind TYPE task_event_kind_word;

ALTER DOMAIN task_key_text
    ADD CONSTRAINT task_key_text_check CHECK (octet_length(VALUE) BETWEEN 1 AND 128);
ALTER DOMAIN task_title_text
    ADD CONSTRAINT task_title_text_check CHECK (octet_length(VALUE) BETWEEN 1 AND 512);
ALTER DOMAIN task_description_text
    ADD CONSTRAINT task_description_text_check CHECK (octet_length(VALUE) <= 65536);
ALTER DOMAIN task_metadata_object
    ADD CONSTRAINT task_metadata_object_check
        CHECK (jsonb_typeof(VALUE) = 'object' AND octet_length(VALUE::text) <= 32768);
ALTER DOMAIN task_status_word
    ADD CONSTRAINT task_status_word_check
        CHECK (VALUE IN ('open', 'claimed', 'done', 'cancelled'));
ALTER DOMAIN task_result_text
    ADD CONSTRAINT task_result_text_check CHECK (octet_length(VALUE) <= 65536);
ALTER DOMAIN task_cancel_reason_text
    ADD CONSTRAINT task_cancel_reason_text_check CHECK (octet_length(VALUE) BETWEEN 1 AND 4096);
ALTER DOMAIN task_priority_rank
    ADD CONSTRAINT task_priority_rank_check CHECK (VALUE BETWEEN 0 AND 3);
ALTER DOMAIN task_event_kind_word
    ADD CONSTRAINT task_event_kind_word_check
        CHECK (VALUE IN ('created', 'claimed', 'renewed', 'released', 'completed', 'cancelled',
                         'dependencies_changed', 'priority_changed'));

DROP TRIGGER webhook_task_event ON task_events;
DROP FUNCTION webhook_on_task_event();

-- Queue the webhook event of a task event, as the row trigger of 0025 did:
-- every kind but `renewed` (a lease heartbeat, not news), only when the team
-- has a hook; webhook_enqueue picks the hooks subscribed to `task`. The
-- task's key, title and status are as the write left them (the trigger read
-- them after the statement); never its description or result.
CREATE FUNCTION task_event_webhook(
    p_team    uuid,
    p_task    uuid,
    p_key     text,
    p_title   text,
    p_status  text,
    p_kind    text,
    p_agent   uuid,
    p_session text,
    p_detail  jsonb)
RETURNS void LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF p_kind = 'renewed' OR NOT EXISTS (SELECT 1 FROM webhooks w WHERE w.team_id = p_team) THEN
        RETURN;
    END IF;
    PERFORM webhook_enqueue(
        p_team, 'task', 'task.' || p_kind, NULL,
        jsonb_build_object(
            'task_id', p_task,
            'key', p_key,
            'title', p_title,
            'status', p_status,
            'by', webhook_address(p_team, p_agent, p_session),
            'detail', p_detail));
END
$$;

-- task_rows of 0049, as it was (its columns now of the domains above).
CREATE VIEW task_rows AS
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

-- task_row_of of 0049, as it was.
CREATE FUNCTION task_row_of(p_task tasks)
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

-- task_change of 0036, the task_events row's webhook event queued by the
-- function itself.
CREATE FUNCTION task_change(
    p_op            text,
    p_team          uuid,
    p_agent         uuid,
    p_session       text,
    p_token         uuid,
    p_window        uuid,
    p_epoch         bigint,
    p_key           text,
    p_lease_seconds bigint,
    p_result        text,
    p_quota_default bigint)
RETURNS TABLE (refusal text, session_epoch bigint, refused_since timestamptz, declined text,
               quota_limit bigint, quota_used bigint, task task_rows)
LANGUAGE plpgsql VOLATILE
-- Plan once per connection: every statement looks a row up by key.
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_task    tasks;
    v_row     task_rows;
    v_mine    boolean;
    v_event text;
    v_detail jsonb;
    v_lease interval := make_interval(secs => coalesce(p_lease_seconds, 0));
BEGIN
    -- complete_task's quota comes first, where it was read before this was
    -- one call: a refused write is refused the same way.
    IF p_op = 'complete' THEN
        -- A row only when refused: otherwise both figures stay NULL.
        SELECT q.limit_bytes, q.used_bytes INTO quota_limit, quota_used
          FROM storage_quota_refusal(p_team, octet_length(p_result), p_quota_default) q;
        IF FOUND THEN
            declined := 'quota';
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;

    SELECT r.refusal, r.session_epoch, r.refused_since
      INTO refusal, session_epoch, refused_since
      FROM agent_write_refusal(p_team, p_agent, p_token, p_window, p_epoch, false) r;
    IF refusal IS NOT NULL THEN
        RETURN NEXT;
        RETURN;
    END IF;

    IF p_op = 'claim' THEN
        PERFORM lock_task_dependencies(p_team, false);
    END IF;
    -- A new statement after the locks: it sees what committed before them.
    SELECT * INTO v_task FROM tasks t
     WHERE t.team_id = p_team AND t.key = p_key
       FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        declined := 'no_task';
        RETURN NEXT;
        RETURN;
    END IF;
    -- Another new statement: it sees the row as the lock left it.
    v_row := task_row_of(v_task);
    v_mine := v_row.holder_agent_id = p_agent AND v_row.holder_session = p_session;

    IF p_op = 'claim' THEN
        declined := CASE
            WHEN v_row.status IN ('done', 'cancelled') THEN 'finished'
            WHEN v_row.status = 'claimed' AND NOT v_row.lapsed AND v_mine THEN NULL
            WHEN v_row.status = 'claimed' AND NOT v_row.lapsed THEN 'held'
            WHEN cardinality(v_row.blocked_by) > 0 THEN 'blocked'
        END;
    ELSIF p_op = 'release' AND v_row.status = 'claimed' AND v_mine THEN
        declined := NULL;  -- its own lapsed claim may be released too
    ELSE
        declined := CASE
            WHEN v_row.status IN ('done', 'cancelled') THEN 'finished'
            WHEN v_row.status = 'open' THEN 'not_claimed'
            WHEN v_mine AND v_row.lapsed THEN 'lapsed_mine'
            WHEN v_mine THEN NULL
            WHEN v_row.lapsed THEN 'lapsed_other'
            ELSE 'held_other'
        END;
    END IF;
    IF declined IS NOT NULL THEN
        task := v_row;
        RETURN NEXT;
        RETURN;
    END IF;

    IF p_op = 'renew' OR (p_op = 'claim' AND v_row.status = 'claimed' AND NOT v_row.lapsed) THEN
        UPDATE tasks t SET lease_expires_at = now() + v_lease, updated_at = now()
         WHERE t.id = v_row.id
        RETURNING t.* INTO v_task;
        v_event := 'renewed';
        v_detail := jsonb_build_object('lease_seconds', p_lease_seconds);
        IF p_op = 'claim' THEN
            v_detail := v_detail || jsonb_build_object('via', 'claim_task');
        END IF;
    ELSIF p_op = 'claim' THEN
        UPDATE tasks t
           SET status = 'claimed', holder_agent_id = p_agent, holder_session = p_session,
               lease_expires_at = now() + v_lease, claimed_at = now(), updated_at = now()
         WHERE t.id = v_row.id
        RETURNING t.* INTO v_task;
        v_event := 'claimed';
        v_detail := jsonb_build_object(
            'lease_seconds', p_lease_seconds,
            'lapsed_holder', task_window_address(v_row.holder_agent, v_row.holder_session));
    ELSIF p_op = 'release' THEN
        UPDATE tasks t
           SET status = 'open', holder_agent_id = NULL, holder_session = NULL,
               lease_expires_at = NULL, claimed_at = NULL, updated_at = now()
         WHERE t.id = v_row.id
        RETURNING t.* INTO v_task;
        v_event := 'released';
        v_detail := jsonb_build_object('lease_had_lapsed', v_row.lapsed);
    ELSIF p_op = 'complete' THEN
        UPDATE tasks t
           SET status = 'done', holder_agent_id = NULL, holder_session = NULL,
               lease_expires_at = NULL, completed_by = p_agent, completed_session = p_session,
               completed_at = now(), result = p_result, updated_at = now()
         WHERE t.id = v_row.id
        RETURNING t.* INTO v_task;
        v_event := 'completed';
        v_detail := jsonb_build_object('result_bytes', octet_length(p_result));
    ELSE
        RAISE EXCEPTION 'task_change: unknown operation %', p_op;
    END IF;

    INSERT INTO task_events (team_id, task_id, kind, agent_id, session, detail)
    VALUES (p_team, v_row.id, v_event, p_agent, p_session, v_detail);
    -- Its webhook event, as the trigger of 0025 queued it: not for a
    -- renewal, and only when the team has a hook (task_event_webhook).
    IF v_event <> 'renewed' THEN
        IF EXISTS (SELECT 1 FROM webhooks w WHERE w.team_id = p_team) THEN
            PERFORM task_event_webhook(p_team, v_task.id, v_task.key, v_task.title, v_task.status,
                                       v_event, p_agent, p_session, v_detail);
        END IF;
    END IF;
    task := task_row_of(v_task);
    RETURN NEXT;
END
$$;

-- task_claim_next of 0049, the task_events row's webhook event queued by the
-- function itself.
CREATE FUNCTION task_claim_next(
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
    v_detail        jsonb;
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

    v_detail := jsonb_build_object(
        'lease_seconds', p_lease_seconds,
        'lapsed_holder', task_window_address(v_prev_agent, v_prev_session),
        'via', 'claim_next_task');
    INSERT INTO task_events (team_id, task_id, kind, agent_id, session, detail)
    VALUES (p_team, v_id, 'claimed', p_agent, p_session, v_detail);
    SELECT * INTO v_task FROM tasks t WHERE t.id = v_id;
    -- Its webhook event, only when the team has a hook (task_event_webhook).
    IF EXISTS (SELECT 1 FROM webhooks w WHERE w.team_id = p_team) THEN
        PERFORM task_event_webhook(p_team, v_id, v_task.key, v_task.title, v_task.status,
                                   'claimed', p_agent, p_session, v_detail);
    END IF;
    task := task_row_of(v_task);
    RETURN NEXT;
END
$$;
