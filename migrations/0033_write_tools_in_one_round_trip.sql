-- One round trip per write tool (issue 34, item 1): acquire_lock,
-- release_lock, heartbeat and set_note.
--
-- Before: each ran BEGIN, the write fence (agent_write_refusal), the quota
-- read (set_note), its lookups, the write and COMMIT as separate statements,
-- five to eight round trips with the fence's lock held across all of them.
-- Now each is one call of a function below, as store_conversation_message
-- (migrations 0014, 0016) already is: the fence first, then the quota, the
-- lookups and the writes, each statement on a fresh snapshot (the functions
-- are VOLATILE), all in the caller's one implicit transaction.
--
-- "Who may write" stays in one place: every function calls
-- agent_write_refusal() (migration 0016) and does not restate it.
--
-- Every function answers one row of the same shape, so the Rust side reads
-- them alike (store/sessions.rs `FencedWrite`):
--   refusal, session_epoch, refused_since  the fence's answer, exactly as
--                                          agent_write_refusal gives it;
--                                          when refusal is set nothing was
--                                          written and the rest is NULL
--   outcome                                what happened, a short code
--   detail                                 the data its answer (or its
--                                          refusal's words) needs, as jsonb
-- A refusal is a code and data, never words: Rust words it (the same texts
-- as before), so nothing here raises an error a caller has to parse.

-- The quota: storage_quota_refusal() of migration 0031 (the one rule, read
-- without a lock as check_quota reads it), a row only when refused; set_note
-- turns its row into {limit, used, incoming} for its detail.

-- A lock as its tools show it: the holder's name read now (a scalar
-- subquery of the current row, so a takeover waited out names the new
-- holder). NULL when there is no row.
CREATE FUNCTION team_lock_state(p_team uuid, p_name text)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
               'name', l.name,
               'holder_agent_id', l.holder_agent_id,
               'agent', (SELECT a.name FROM agents a
                          WHERE a.team_id = l.team_id AND a.id = l.holder_agent_id),
               'holder_session', l.holder_session,
               'purpose', l.purpose,
               'acquired_at', l.acquired_at,
               'expires_at', l.expires_at,
               'seconds_left', greatest(0, ceil(extract(epoch FROM l.expires_at - now())))::bigint,
               'expired', l.expires_at <= now())
      FROM locks l
     WHERE l.team_id = p_team AND l.name = p_name
$$;

-- acquire_lock. Outcomes: taken, extended (detail: the lock now), held
-- (detail: the lock as its holder has it), vanished (no row after the
-- upsert: someone released it in between; the caller is asked to retry).
CREATE FUNCTION acquire_team_lock(
    p_team uuid, p_agent uuid, p_token uuid, p_window uuid, p_epoch bigint,
    p_session text, p_name text, p_ttl interval, p_purpose text)
RETURNS TABLE (refusal text, session_epoch bigint, refused_since timestamptz,
               outcome text, detail jsonb)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_extended boolean;
BEGIN
    SELECT r.refusal, r.session_epoch, r.refused_since
      INTO refusal, session_epoch, refused_since
      FROM agent_write_refusal(p_team, p_agent, p_token, p_window, p_epoch, false) r;
    IF refusal IS NOT NULL THEN
        RETURN NEXT;
        RETURN;
    END IF;

    -- The WHERE of DO UPDATE is the rule: an expired row goes to anyone, a
    -- live one only to its own window. When it refuses, the row stays locked
    -- by this statement, so the holder read below is the one that refused us.
    INSERT INTO locks AS l (team_id, name, holder_agent_id, holder_session, purpose,
                            acquired_at, expires_at)
    VALUES (p_team, p_name, p_agent, p_session, p_purpose, now(), now() + p_ttl)
    ON CONFLICT (team_id, name) DO UPDATE SET
        holder_agent_id = EXCLUDED.holder_agent_id,
        holder_session = EXCLUDED.holder_session,
        purpose = CASE WHEN l.expires_at > now() THEN coalesce(EXCLUDED.purpose, l.purpose)
                       ELSE EXCLUDED.purpose END,
        acquired_at = CASE WHEN l.expires_at > now() THEN l.acquired_at ELSE now() END,
        expires_at = EXCLUDED.expires_at
    WHERE l.expires_at <= now()
       OR (l.holder_agent_id = EXCLUDED.holder_agent_id
           AND l.holder_session = EXCLUDED.holder_session)
    RETURNING l.acquired_at < now() INTO v_extended;
    outcome := CASE WHEN NOT FOUND THEN 'held' WHEN v_extended THEN 'extended' ELSE 'taken' END;

    detail := team_lock_state(p_team, p_name);
    IF detail IS NULL THEN
        outcome := 'vanished';
    END IF;
    RETURN NEXT;
END
$$;

-- release_lock: only the holding window; its own expired lock too (that
-- removes the stale row). Outcomes: released (detail: the lock as it was),
-- held (by another window, live; detail: the lock), not_held (no row, or
-- another window's expired one).
CREATE FUNCTION release_team_lock(
    p_team uuid, p_agent uuid, p_token uuid, p_window uuid, p_epoch bigint,
    p_session text, p_name text)
RETURNS TABLE (refusal text, session_epoch bigint, refused_since timestamptz,
               outcome text, detail jsonb)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_mine    boolean;
    v_expired boolean;
BEGIN
    SELECT r.refusal, r.session_epoch, r.refused_since
      INTO refusal, session_epoch, refused_since
      FROM agent_write_refusal(p_team, p_agent, p_token, p_window, p_epoch, false) r;
    IF refusal IS NOT NULL THEN
        RETURN NEXT;
        RETURN;
    END IF;

    -- Lock the row first; a takeover this waits out is read as it is after.
    SELECT l.holder_agent_id = p_agent AND l.holder_session = p_session, l.expires_at <= now()
      INTO v_mine, v_expired
      FROM locks l
     WHERE l.team_id = p_team AND l.name = p_name
       FOR UPDATE;
    IF NOT FOUND THEN
        outcome := 'not_held';
        RETURN NEXT;
        RETURN;
    END IF;
    -- A new statement after the row lock: the holder as it is now.
    detail := team_lock_state(p_team, p_name);
    IF v_mine THEN
        DELETE FROM locks l WHERE l.team_id = p_team AND l.name = p_name;
        outcome := 'released';
    ELSIF NOT v_expired THEN
        outcome := 'held';
    ELSE
        outcome := 'not_held';
    END IF;
    RETURN NEXT;
END
$$;

-- heartbeat: upsert this window's presence. Each optional field travels as
-- (given, value): not given keeps the stored value on update; given with
-- NULL clears it. Outcome: beat (detail: the window as now stored, the
-- columns of store/presence.rs `Window`).
CREATE FUNCTION store_heartbeat(
    p_team uuid, p_agent uuid, p_token uuid, p_window uuid, p_epoch bigint,
    p_session text, p_status text,
    p_repo_given boolean, p_repo text,
    p_branch_given boolean, p_branch text,
    p_activity_given boolean, p_activity text,
    p_project_given boolean, p_project text,
    p_role_given boolean, p_role text,
    p_ttl integer, p_default_ttl integer)
RETURNS TABLE (refusal text, session_epoch bigint, refused_since timestamptz,
               outcome text, detail jsonb)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
BEGIN
    SELECT r.refusal, r.session_epoch, r.refused_since
      INTO refusal, session_epoch, refused_since
      FROM agent_write_refusal(p_team, p_agent, p_token, p_window, p_epoch, false) r;
    IF refusal IS NOT NULL THEN
        RETURN NEXT;
        RETURN;
    END IF;

    -- One statement writes the row, so concurrent beats of one window never
    -- interleave field by field.
    WITH beat AS (
        INSERT INTO presence AS p (team_id, agent_id, session, status, repo, branch, activity,
                                   project, role, ttl_seconds, expires_at)
        VALUES (p_team, p_agent, p_session, coalesce(p_status, 'active'), p_repo, p_branch,
                p_activity, p_project, p_role, coalesce(p_ttl, p_default_ttl),
                now() + make_interval(secs => coalesce(p_ttl, p_default_ttl)))
        ON CONFLICT (team_id, agent_id, session) DO UPDATE SET
            status = coalesce(p_status, p.status),
            repo = CASE WHEN p_repo_given THEN EXCLUDED.repo ELSE p.repo END,
            branch = CASE WHEN p_branch_given THEN EXCLUDED.branch ELSE p.branch END,
            activity = CASE WHEN p_activity_given THEN EXCLUDED.activity ELSE p.activity END,
            project = CASE WHEN p_project_given THEN EXCLUDED.project ELSE p.project END,
            role = CASE WHEN p_role_given THEN EXCLUDED.role ELSE p.role END,
            ttl_seconds = coalesce(p_ttl, p.ttl_seconds),
            last_seen_at = now(),
            expires_at = now() + make_interval(secs => coalesce(p_ttl, p.ttl_seconds))
        RETURNING p.*)
    SELECT jsonb_build_object(
               'session', p.session,
               'address', CASE WHEN p.session = '' THEN a.name ELSE a.name || '/' || p.session END,
               'online', p.expires_at > now() AND a.disabled_at IS NULL,
               'status', p.status, 'repo', p.repo, 'branch', p.branch,
               'activity', p.activity, 'project', p.project, 'role', p.role,
               'ttl_seconds', p.ttl_seconds, 'last_seen_at', p.last_seen_at,
               'expires_at', p.expires_at)
      INTO detail
      FROM beat p JOIN agents a ON a.team_id = p.team_id AND a.id = p.agent_id;
    outcome := 'beat';
    RETURN NEXT;
END
$$;

-- set_note: create or replace a note and record its revision. p_tags NULL
-- keeps the current tags (none on a new note); '{}' clears them. Outcomes:
-- quota (detail: storage_quota_refusal's), unchanged (same value and tags:
-- nothing written; detail: the note as it stands), set (detail: the note
-- as written). The value is charged twice: on the note and its revision.
CREATE FUNCTION store_note(
    p_team uuid, p_agent uuid, p_token uuid, p_window uuid, p_epoch bigint,
    p_session text, p_id uuid, p_scope text, p_key text, p_value text, p_tags text[],
    p_default_quota bigint)
RETURNS TABLE (refusal text, session_epoch bigint, refused_since timestamptz,
               outcome text, detail jsonb)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_was_deleted boolean;
    v_id          uuid;
    v_created     boolean;
BEGIN
    SELECT r.refusal, r.session_epoch, r.refused_since
      INTO refusal, session_epoch, refused_since
      FROM agent_write_refusal(p_team, p_agent, p_token, p_window, p_epoch, false) r;
    IF refusal IS NOT NULL THEN
        RETURN NEXT;
        RETURN;
    END IF;

    SELECT jsonb_build_object('limit', q.limit_bytes, 'used', q.used_bytes,
                              'incoming', 2 * octet_length(p_value)::bigint)
      INTO detail
      FROM storage_quota_refusal(p_team, 2 * octet_length(p_value)::bigint, p_default_quota) q;
    IF detail IS NOT NULL THEN
        outcome := 'quota';
        RETURN NEXT;
        RETURN;
    END IF;

    -- Lock the note if it exists, so "was it deleted?" still holds when the
    -- upsert below runs. (A missing note cannot be locked; a concurrent first
    -- set then meets the upsert's conflict and becomes revision 2.)
    SELECT n.deleted_at IS NOT NULL INTO v_was_deleted
      FROM notes n
     WHERE n.team_id = p_team AND n.scope = p_scope AND n.key = p_key
       FOR UPDATE;

    -- The WHERE on the update makes an identical set a no-op: no row comes
    -- back, and no revision is written. A deleted note is set again (it
    -- counts as created, with the next revision number).
    INSERT INTO notes AS n (id, team_id, scope, key, value, tags, revision,
                            created_by_agent_id, created_by_session,
                            updated_by_agent_id, updated_by_session)
    VALUES (p_id, p_team, p_scope, p_key, p_value, coalesce(p_tags, '{}'::text[]), 1,
            p_agent, p_session, p_agent, p_session)
    ON CONFLICT (team_id, scope, key) DO UPDATE SET
        value = EXCLUDED.value,
        tags = CASE WHEN n.deleted_at IS NOT NULL THEN EXCLUDED.tags
                    ELSE coalesce(p_tags, n.tags) END,
        revision = n.revision + 1,
        updated_by_agent_id = EXCLUDED.updated_by_agent_id,
        updated_by_session = EXCLUDED.updated_by_session,
        updated_at = now(),
        deleted_at = NULL
    WHERE n.deleted_at IS NOT NULL
       OR n.value IS DISTINCT FROM EXCLUDED.value
       OR (p_tags IS NOT NULL AND n.tags IS DISTINCT FROM p_tags)
    RETURNING n.id, n.revision = 1 OR coalesce(v_was_deleted, false) INTO v_id, v_created;

    IF FOUND THEN
        -- The revision copies the stored value inside the database.
        INSERT INTO note_revisions (team_id, note_id, revision, action, value, tags,
                                    author_agent_id, author_session, at)
        SELECT n.team_id, n.id, n.revision, 'set', n.value, n.tags, n.updated_by_agent_id,
               n.updated_by_session, n.updated_at
          FROM notes n WHERE n.team_id = p_team AND n.id = v_id;
        outcome := 'set';
    ELSE
        outcome := 'unchanged';
    END IF;

    SELECT jsonb_build_object(
               'revision', n.revision,
               'created', coalesce(v_created, false),
               'tags', to_jsonb(n.tags),
               'bytes', octet_length(n.value)::bigint,
               'updated_at', n.updated_at,
               'updated_by', CASE WHEN n.updated_by_session = '' THEN u.name
                                  ELSE u.name || '/' || n.updated_by_session END)
      INTO detail
      FROM notes n JOIN agents u ON u.team_id = n.team_id AND u.id = n.updated_by_agent_id
     WHERE n.team_id = p_team AND n.scope = p_scope AND n.key = p_key;
    RETURN NEXT;
END
$$;

-- Whether label p_label of the agent belongs to a live registered window
-- (session credential and its token unrevoked, unexpired): the private data
-- of such a window is refused to the bare agent token wearing its label.
-- The rule of store/conversations/access.rs `registered_window`, for the
-- functions below.
CREATE FUNCTION window_label_registered(p_team uuid, p_agent uuid, p_label text)
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT EXISTS (
        SELECT 1 FROM agent_sessions s
          JOIN agent_tokens t ON t.team_id = s.team_id AND t.id = s.token_id
         WHERE s.team_id = p_team AND s.agent_id = p_agent AND s.label = p_label
           AND s.revoked_at IS NULL AND s.expires_at > now() AND t.revoked_at IS NULL)
$$;

-- The seat through which window (p_agent, p_session) may act as a recipient
-- of message p_message, as store/receipts.rs `recipient_seat` decided it in
-- Rust: code ok (with the seat), not_found (no such message, or not visible
-- to this window: the same answer), borrowed (a bare token wearing the label
-- of a live registered window; p_bare_label says the caller is such a
-- token), invited (a seat not yet joined), not_a_recipient (reads through a
-- project grant only).
CREATE FUNCTION conversation_recipient_seat(
    p_team uuid, p_agent uuid, p_session text, p_bare_label boolean, p_message uuid)
RETURNS TABLE (code text, conversation_id uuid, seq bigint, seat_id uuid, backend text)
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
DECLARE
    v_project uuid;
    v_state   text;
    v_from    bigint;
BEGIN
    SELECT m.conversation_id, m.seq, c.project_id, c.backend::text
      INTO conversation_id, seq, v_project, backend
      FROM conversation_messages m
      JOIN conversations c ON c.team_id = m.team_id AND c.id = m.conversation_id
     WHERE m.team_id = p_team AND m.id = p_message;
    IF NOT FOUND THEN
        code := 'not_found';
        RETURN NEXT;
        RETURN;
    END IF;
    IF p_bare_label AND window_label_registered(p_team, p_agent, p_session) THEN
        code := 'borrowed';
        RETURN NEXT;
        RETURN;
    END IF;
    SELECT s.id, s.state::text, s.history_from_seq INTO seat_id, v_state, v_from
      FROM conversation_members s
     WHERE s.team_id = p_team AND s.conversation_id = conversation_recipient_seat.conversation_id
       AND s.agent_id = p_agent AND s.session = p_session;
    code := CASE
        WHEN v_state = 'active' AND seq >= v_from THEN 'ok'
        WHEN v_state = 'active' THEN 'not_found'
        WHEN v_project IS NOT NULL AND EXISTS (
                 SELECT 1 FROM project_grants g
                  WHERE g.team_id = p_team AND g.project_id = v_project AND g.agent_id = p_agent)
             THEN 'not_a_recipient'
        WHEN v_state = 'invited' THEN 'invited'
        ELSE 'not_found' END;
    RETURN NEXT;
END
$$;

-- ack_message: the recipient seat acknowledges (and with p_resolved,
-- resolves) a message; each fact and the note are written once. On a broker
-- conversation the sender's receipt reference is queued (store/inbox's
-- recipient key), and the ack is audited, all in this one call. Outcomes:
-- acked (detail: conversation_id, seq, receipt), or a refusal code of
-- conversation_recipient_seat (detail: conversation_id).
CREATE FUNCTION store_ack(
    p_team uuid, p_agent uuid, p_token uuid, p_window uuid, p_epoch bigint,
    p_session text, p_bare_label boolean, p_message uuid, p_resolved boolean, p_note text,
    p_address text)
RETURNS TABLE (refusal text, session_epoch bigint, refused_since timestamptz,
               outcome text, detail jsonb)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_seat    record;
    v_receipt jsonb;
BEGIN
    SELECT r.refusal, r.session_epoch, r.refused_since
      INTO refusal, session_epoch, refused_since
      FROM agent_write_refusal(p_team, p_agent, p_token, p_window, p_epoch, false) r;
    IF refusal IS NOT NULL THEN
        RETURN NEXT;
        RETURN;
    END IF;

    SELECT * INTO v_seat
      FROM conversation_recipient_seat(p_team, p_agent, p_session, p_bare_label, p_message);
    detail := jsonb_build_object('conversation_id', v_seat.conversation_id, 'seq', v_seat.seq);
    IF v_seat.code <> 'ok' THEN
        outcome := v_seat.code;
        RETURN NEXT;
        RETURN;
    END IF;

    -- One receipt row, last in the lock order: no conversation lock.
    UPDATE message_receipts r
       SET acknowledged_at = COALESCE(r.acknowledged_at, now()),
           resolved_at = CASE WHEN p_resolved THEN COALESCE(r.resolved_at, now())
                              ELSE r.resolved_at END,
           ack_note = COALESCE(r.ack_note, p_note)
     WHERE r.team_id = p_team AND r.message_id = p_message AND r.member_id = v_seat.seat_id
    RETURNING jsonb_build_object(
                  'recipient', p_address, 'stored_at', r.stored_at,
                  'delivered_at', r.delivered_at, 'presented_at', r.presented_at,
                  'acknowledged_at', r.acknowledged_at, 'resolved_at', r.resolved_at,
                  'note', r.ack_note)
      INTO v_receipt;
    IF NOT FOUND THEN
        outcome := 'not_a_recipient';
        RETURN NEXT;
        RETURN;
    END IF;

    IF v_seat.backend <> 'postgres' THEN
        INSERT INTO inbox_references
            (id, team_id, recipient_key, recipient_id, recipient_session, kind,
             conversation_id, message_id, seq, actor, receipt)
        SELECT gen_random_uuid(), m.team_id,
               encode(substring(sha256(convert_to(m.sender_id::text || '/' || m.sender_session,
                                                  'UTF8')) FROM 1 FOR 16), 'hex'),
               m.sender_id, m.sender_session, 'receipt', m.conversation_id, m.id, m.seq,
               p_address, CASE WHEN p_resolved THEN 'resolved' ELSE 'acknowledged' END
          FROM conversation_messages m WHERE m.team_id = p_team AND m.id = p_message
        ON CONFLICT DO NOTHING;
    END IF;

    INSERT INTO conversation_audit
        (team_id, conversation_id, actor_id, actor_session, action, subject, detail)
    VALUES (p_team, v_seat.conversation_id, p_agent, p_session, 'ack', p_message::text,
            jsonb_build_object('message_id', p_message, 'seq', v_seat.seq,
                               'resolved', p_resolved, 'note_bytes', octet_length(p_note)));

    outcome := 'acked';
    detail := detail || jsonb_build_object('receipt', v_receipt);
    RETURN NEXT;
END
$$;

-- mark_presented: all or nothing over p_messages (sorted, distinct: two
-- calls lock shared receipts in one order). Outcomes: presented (detail: an
-- array of {message_id, conversation_id, seq, presented_at}), or a refusal
-- code of conversation_recipient_seat (detail: message_id, conversation_id)
-- with nothing written.
CREATE FUNCTION store_presented(
    p_team uuid, p_agent uuid, p_token uuid, p_window uuid, p_epoch bigint,
    p_session text, p_bare_label boolean, p_messages uuid[])
RETURNS TABLE (refusal text, session_epoch bigint, refused_since timestamptz,
               outcome text, detail jsonb)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_message   uuid;
    v_seat      record;
    v_at        timestamptz;
    v_presented jsonb := '[]'::jsonb;
BEGIN
    SELECT r.refusal, r.session_epoch, r.refused_since
      INTO refusal, session_epoch, refused_since
      FROM agent_write_refusal(p_team, p_agent, p_token, p_window, p_epoch, false) r;
    IF refusal IS NOT NULL THEN
        RETURN NEXT;
        RETURN;
    END IF;

    BEGIN
        FOREACH v_message IN ARRAY p_messages LOOP
            SELECT * INTO v_seat
              FROM conversation_recipient_seat(p_team, p_agent, p_session, p_bare_label,
                                               v_message);
            IF v_seat.code = 'ok' THEN
                UPDATE message_receipts r SET presented_at = COALESCE(r.presented_at, now())
                 WHERE r.team_id = p_team AND r.message_id = v_message
                   AND r.member_id = v_seat.seat_id
                RETURNING r.presented_at INTO v_at;
                IF NOT FOUND THEN
                    v_seat.code := 'not_a_recipient';
                END IF;
            END IF;
            IF v_seat.code <> 'ok' THEN
                outcome := v_seat.code;
                detail := jsonb_build_object('message_id', v_message,
                                             'conversation_id', v_seat.conversation_id);
                -- Undo the receipts marked so far: all or nothing.
                RAISE EXCEPTION USING ERRCODE = 'AC002';
            END IF;
            v_presented := v_presented || jsonb_build_array(jsonb_build_object(
                'message_id', v_message, 'conversation_id', v_seat.conversation_id,
                'seq', v_seat.seq, 'presented_at', v_at));
        END LOOP;
    EXCEPTION WHEN SQLSTATE 'AC002' THEN
        RETURN NEXT;
        RETURN;
    END;
    outcome := 'presented';
    detail := v_presented;
    RETURN NEXT;
END
$$;

-- confirm_inbox_delivery's PostgreSQL part: record `delivered` on this
-- window's references named (p_key: store/inbox `recipient_key`) and, for a
-- message, on its receipt, before anything is acked to a broker (the caller
-- acks after this commits). Idempotent. Outcomes: borrowed (a bare token
-- wearing a registered window's label: nothing written), confirmed (detail:
-- [{id, fresh, broker_ack}] for each reference of this window named).
CREATE FUNCTION confirm_inbox_references(
    p_team uuid, p_agent uuid, p_token uuid, p_window uuid, p_epoch bigint,
    p_session text, p_bare_label boolean, p_key text, p_ids uuid[])
RETURNS TABLE (refusal text, session_epoch bigint, refused_since timestamptz,
               outcome text, detail jsonb)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
BEGIN
    SELECT r.refusal, r.session_epoch, r.refused_since
      INTO refusal, session_epoch, refused_since
      FROM agent_write_refusal(p_team, p_agent, p_token, p_window, p_epoch, false) r;
    IF refusal IS NOT NULL THEN
        RETURN NEXT;
        RETURN;
    END IF;
    IF p_bare_label AND window_label_registered(p_team, p_agent, p_session) THEN
        outcome := 'borrowed';
        RETURN NEXT;
        RETURN;
    END IF;

    WITH before AS (
        SELECT i.id, i.delivered_at IS NULL AS fresh, i.broker_ack FROM inbox_references i
         WHERE i.team_id = p_team AND i.recipient_key = p_key AND i.id = ANY(p_ids)
         ORDER BY i.id
           FOR UPDATE),
    marked AS (
        UPDATE inbox_references i SET delivered_at = now()
          FROM before WHERE i.id = before.id AND before.fresh
         RETURNING i.id, i.kind, i.message_id),
    receipts AS (
        UPDATE message_receipts r SET delivered_at = COALESCE(r.delivered_at, now())
          FROM marked
         WHERE marked.kind = 'message' AND r.team_id = p_team
           AND r.message_id = marked.message_id
           AND r.member_id IN (SELECT w.id FROM conversation_members w
                                WHERE w.team_id = p_team AND w.agent_id = p_agent
                                  AND w.session = p_session))
    SELECT coalesce(jsonb_agg(jsonb_build_object('id', b.id, 'fresh', b.fresh,
                                                 'broker_ack', b.broker_ack)), '[]'::jsonb)
      INTO detail
      FROM before b;
    outcome := 'confirmed';
    RETURN NEXT;
END
$$;
