-- Task writes in one round trip (issue 34, item 1).
--
-- Before: claim_task, claim_next_task, renew_task_lease, release_task and
-- complete_task each ran BEGIN, the write fence, (a quota read,) the task row
-- locked and read, the UPDATE, the task_events row, the task read back and
-- COMMIT as separate round trips. Now each is one call of task_change() or
-- task_claim_next(), as a conversation send is one call of
-- store_conversation_message() (migrations 0014, 0016):
--   1. the write fence: agent_write_refusal() (migration 0016), called, not
--      copied, so "who may write" stays written once;
--   2. the quota (complete_task only): storage_quota_refusal() (migration 0031);
--   3. the team's dependency lock, shared (a claim), then the task row locked;
--   4. the decision, the UPDATE and the task_events row (its webhook trigger,
--      migration 0025, fires as before);
--   5. the task read back from task_rows.
-- A refusal is a code with the data its words need, never an exception: the
-- fence's columns (refusal, session_epoch, refused_since), `declined` for the
-- task's own refusals, the quota's figures and the task as it was locked.
-- Nothing is written before a refusal is decided. Rust (store/tasks/) turns
-- the codes into words.

-- A task as every reader sees it, the one definition of its columns (Rust's
-- TaskRow reads these names). The lapse is decided here, on the database
-- clock. The agents' names are scalar subqueries, not joins: a reader that
-- locks the row (FOR NO KEY UPDATE, which through this view locks the task
-- row only) and waits out a concurrent claim is handed the row as that claim
-- left it, and only a subquery is evaluated again against it.
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
              ORDER BY p.seq) AS blocked_by_cancelled
  FROM tasks t;

-- The team's dependency lock: a re-point (set_task_dependencies) takes it
-- exclusively before its cycle check, a claim shared before it reads the
-- task, so a claim that waited behind a re-point reads the new dependencies.
-- The class is ASCII 'ACSd' (the agent credential lock is 'ACSa').
CREATE FUNCTION lock_task_dependencies(p_team uuid, p_exclusive boolean)
RETURNS void LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF p_exclusive THEN
        PERFORM pg_advisory_xact_lock(1094931300, hashtext(p_team::text));
    ELSE
        PERFORM pg_advisory_xact_lock_shared(1094931300, hashtext(p_team::text));
    END IF;
END
$$;

-- A window's address as refusals and events print it: `agent` or
-- `agent/session`.
CREATE FUNCTION task_window_address(p_agent text, p_session text)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN coalesce(p_session, '') = '' THEN p_agent ELSE p_agent || '/' || p_session END
$$;

-- One change to the task p_key, p_op one of:
--   claim     claim_task: a live claim of this window is renewed instead
--   renew     renew_task_lease
--   release   release_task
--   complete  complete_task (p_result; the quota first)
-- `declined` codes (the task as locked in `task`):
--   quota (quota_limit, quota_used; no task), no_task (no task),
--   finished (done or cancelled), held (claim: someone else's live claim),
--   blocked (claim: unfinished dependencies), and for the holder's tools
--   not_claimed (open), lapsed_mine, lapsed_other, held_other.
-- Accepted: declined is NULL and `task` is the task after the change.
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
    SELECT * INTO v_row FROM task_rows v
     WHERE v.team_id = p_team AND v.key = p_key
       FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        declined := 'no_task';
        RETURN NEXT;
        RETURN;
    END IF;
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
         WHERE t.id = v_row.id;
        v_event := 'renewed';
        v_detail := jsonb_build_object('lease_seconds', p_lease_seconds);
        IF p_op = 'claim' THEN
            v_detail := v_detail || jsonb_build_object('via', 'claim_task');
        END IF;
    ELSIF p_op = 'claim' THEN
        UPDATE tasks t
           SET status = 'claimed', holder_agent_id = p_agent, holder_session = p_session,
               lease_expires_at = now() + v_lease, claimed_at = now(), updated_at = now()
         WHERE t.id = v_row.id;
        v_event := 'claimed';
        v_detail := jsonb_build_object(
            'lease_seconds', p_lease_seconds,
            'lapsed_holder', task_window_address(v_row.holder_agent, v_row.holder_session));
    ELSIF p_op = 'release' THEN
        UPDATE tasks t
           SET status = 'open', holder_agent_id = NULL, holder_session = NULL,
               lease_expires_at = NULL, claimed_at = NULL, updated_at = now()
         WHERE t.id = v_row.id;
        v_event := 'released';
        v_detail := jsonb_build_object('lease_had_lapsed', v_row.lapsed);
    ELSIF p_op = 'complete' THEN
        UPDATE tasks t
           SET status = 'done', holder_agent_id = NULL, holder_session = NULL,
               lease_expires_at = NULL, completed_by = p_agent, completed_session = p_session,
               completed_at = now(), result = p_result, updated_at = now()
         WHERE t.id = v_row.id;
        v_event := 'completed';
        v_detail := jsonb_build_object('result_bytes', octet_length(p_result));
    ELSE
        RAISE EXCEPTION 'task_change: unknown operation %', p_op;
    END IF;

    INSERT INTO task_events (team_id, task_id, kind, agent_id, session, detail)
    VALUES (p_team, v_row.id, v_event, p_agent, p_session, v_detail);
    SELECT * INTO task FROM task_rows v WHERE v.team_id = p_team AND v.id = v_row.id;
    RETURN NEXT;
END
$$;

-- claim_next_task: the oldest open (or lapsed) task whose dependencies are
-- all done, claimed for this window. SKIP LOCKED: a row another claimer has
-- locked is passed over, and a row it claimed and committed meanwhile fails
-- the re-checked WHERE, so each task goes to exactly one window however many
-- ask at once. Nothing claimable: declined 'nothing' with the figures that
-- say why (waiting, held, next_expiry, stuck).
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
         ORDER BY t.created_at, t.seq
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
    SELECT * INTO task FROM task_rows v WHERE v.team_id = p_team AND v.id = v_id;
    RETURN NEXT;
END
$$;
