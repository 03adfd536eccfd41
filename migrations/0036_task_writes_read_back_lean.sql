-- Task writes read their task back without the view's dependency plans
-- (issue 34: claim_complete).
--
-- Before: task_claim_next() and task_change() (migration 0032) read the task
-- through the view task_rows: once locked (task_change) and once after the
-- write (both). Each read starts the view's whole plan: four agent lookups
-- and three dependency arrays, each a join, a sort and two index scans, most
-- of them for a task that has no dependencies at all. Starting those plans at
-- every read cost 5-10 % of PostgreSQL's CPU for a claim_next_task +
-- complete_task pair (both versions measured side by side in one session).
--
-- Now the row is built by task_row_of() from the tasks row the function
-- already holds: the four names in one scan of agents, the dependency arrays
-- read through task_rows only when the task has a dependency (an index probe
-- says so), '{}' otherwise, which is what the view answers for it. The task
-- is locked on tasks itself (FOR NO KEY UPDATE), and the row is built in the
-- next statement, whose snapshot sees what the lock waited for. The decisions,
-- the fence, the locks, the writes, the events and every answer are those of
-- 0032; only how the answer row is assembled changes.

-- The row task_rows has for the task `p_task`, built from that row. The
-- columns are task_rows' own (migration 0032), in its order; `lapsed` and
-- `lease_seconds_left` are the view's expressions, which the test
-- task_row_of_answers_what_the_view_answers holds equal for every state.
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
           '{}'::text[], '{}'::text[], '{}'::text[]
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

-- task_change of 0032, the task locked on tasks and read back by task_row_of.
CREATE OR REPLACE FUNCTION task_change(
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
    task := task_row_of(v_task);
    RETURN NEXT;
END
$$;

-- task_claim_next of 0032, the claimed task read back by task_row_of.
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
    SELECT * INTO v_task FROM tasks t WHERE t.id = v_id;
    task := task_row_of(v_task);
    RETURN NEXT;
END
$$;
