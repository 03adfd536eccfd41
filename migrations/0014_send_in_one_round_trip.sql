-- The send's writes in one round trip (store/conversation_messages.rs, `send`).
--
-- A send used to be four round trips (five into an outbox): BEGIN, the claim
-- of the next seq, the insert of the message and its receipts, (the outbox
-- slot,) COMMIT. Under load most of its cost
-- was those round trips, not the statements. This function runs the same
-- statements in the same lock order, server-side, called as one autocommit
-- statement. It is VOLATILE, so under READ COMMITTED each statement in it takes
-- a fresh snapshot, exactly as the statements of a client-side transaction do:
-- what committed while this send waited for the conversation lock is seen by
-- the statements after it (the recipient list, the seat, the agent, the token).
--
-- It only ever stores a send that is plainly acceptable. Anything else (no such
-- conversation, archived, paused, not an active sending seat, a session or token
-- that no longer holds, a project grant gone, an unknown reply_to, a request_id
-- used before) raises SQLSTATE AC001 before its transaction commits, so the
-- claimed seq is rolled back with everything else: no gap, nothing written. The
-- caller then works out the answer (the refusal in words, or the original of a
-- retried send) the way it always has, in Rust. No refusal wording lives here.
--
-- p_window and p_epoch are the session credential's row and epoch (NULL with a
-- bare agent token); p_publish_key is the outbox slot's key, used only when the
-- conversation publishes through the outbox.
CREATE FUNCTION store_conversation_message(
    p_team          uuid,
    p_conversation  uuid,
    p_agent         uuid,
    p_session       text,
    p_token         uuid,
    p_window        uuid,
    p_epoch         bigint,
    p_id            uuid,
    p_request_id    uuid,
    p_body          text,
    p_body_sha256   bytea,
    p_reply_to      uuid,
    p_metadata      jsonb,
    p_publish_key   uuid)
RETURNS TABLE (seq bigint, publication text, created_at timestamptz, recipients text[])
LANGUAGE plpgsql VOLATILE
-- Plan once per connection: these statements look up rows by key, the same
-- plan fits every call, and re-planning the send's CTE on every call (which
-- the default custom-plan heuristic did here) cost more than running it.
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_seq         bigint;
    v_backend     text;
    v_publication text;
    v_project     uuid;
    v_created_at  timestamptz;
    v_recipients  text[];
BEGIN
    -- The session row first, FOR SHARE, as sessions::guard takes it: a revoke,
    -- resume or takeover of this window waits for the send, or the send for it.
    IF p_window IS NOT NULL THEN
        PERFORM 1
           FROM agent_sessions s
           JOIN agent_tokens t ON t.team_id = s.team_id AND t.agent_id = s.agent_id AND t.id = s.token_id
           JOIN agents a ON a.team_id = s.team_id AND a.id = s.agent_id
          WHERE s.team_id = p_team AND s.id = p_window AND s.epoch = p_epoch
            AND s.revoked_at IS NULL AND s.expires_at > now()
            AND t.revoked_at IS NULL AND a.disabled_at IS NULL
            FOR SHARE OF s;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'send not stored: the session does not hold' USING ERRCODE = 'AC001';
        END IF;
    END IF;

    -- The conversation row: every writer's first lock, and the next seq.
    UPDATE conversations c SET last_seq = c.last_seq + 1
     WHERE c.team_id = p_team AND c.id = p_conversation
       AND c.archived_at IS NULL AND c.write_paused_at IS NULL
    RETURNING c.last_seq, c.backend, c.publication, c.project_id
         INTO v_seq, v_backend, v_publication, v_project;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'send not stored: no open conversation' USING ERRCODE = 'AC001';
    END IF;

    -- After the lock, so this snapshot holds everything committed before it:
    -- the sender's seat, agent and token as they are now, the frozen recipient
    -- list (active seats but the sender's; in a project conversation only
    -- agents holding the grant). Synchronous: stored because this commits.
    -- Outbox: pending until the backend confirms, receipts stored then.
    WITH seat AS (
        SELECT m.id
          FROM conversation_members m
         WHERE m.team_id = p_team AND m.conversation_id = p_conversation
           AND m.agent_id = p_agent AND m.session = p_session
           AND m.state = 'active' AND m.role <> 'observer'),
    ins AS (
        INSERT INTO conversation_messages AS msg
            (id, team_id, conversation_id, seq, sender_member_id, sender_id, sender_session,
             request_id, body, body_sha256, body_bytes, reply_to, metadata, backend,
             publication_state, canonical_locator)
        SELECT p_id, p_team, p_conversation, v_seq, seat.id, p_agent, p_session,
               p_request_id, p_body, p_body_sha256, octet_length(p_body), p_reply_to, p_metadata,
               v_backend,
               CASE WHEN v_publication = 'sync' THEN 'stored' ELSE 'pending_publication' END,
               CASE WHEN v_publication = 'sync' THEN p_id::text END
          FROM seat
         WHERE EXISTS (SELECT 1
                         FROM agent_tokens t
                         JOIN agents a ON a.team_id = t.team_id AND a.id = t.agent_id
                        WHERE t.team_id = p_team AND t.id = p_token AND t.agent_id = p_agent
                          AND t.revoked_at IS NULL AND a.disabled_at IS NULL)
           -- A bare token naming a window that is registered with a session
           -- credential is refused: that window speaks with its credential.
           AND (p_window IS NOT NULL OR p_session = '' OR NOT EXISTS (
                    SELECT 1
                      FROM agent_sessions bs
                      JOIN agent_tokens bt ON bt.team_id = bs.team_id AND bt.id = bs.token_id
                     WHERE bs.team_id = p_team AND bs.agent_id = p_agent AND bs.label = p_session
                       AND bs.revoked_at IS NULL AND bs.expires_at > now() AND bt.revoked_at IS NULL))
           AND (v_project IS NULL OR EXISTS (
                    SELECT 1 FROM project_grants g
                     WHERE g.team_id = p_team AND g.project_id = v_project AND g.agent_id = p_agent))
           AND (p_reply_to IS NULL OR EXISTS (
                    SELECT 1 FROM conversation_messages r
                     WHERE r.team_id = p_team AND r.conversation_id = p_conversation
                       AND r.id = p_reply_to))
        ON CONFLICT (team_id, conversation_id, sender_id, request_id) DO NOTHING
        RETURNING msg.created_at, msg.sender_member_id),
    owed AS (
        INSERT INTO message_receipts
            (team_id, message_id, member_id, recipient_id, recipient_session, stored_at)
        SELECT s.team_id, p_id, s.id, s.agent_id, s.session,
               CASE WHEN v_publication = 'sync' THEN now() END
          FROM ins, conversation_members s
         WHERE s.team_id = p_team AND s.conversation_id = p_conversation
           AND s.state = 'active' AND s.id <> ins.sender_member_id
           AND (v_project IS NULL OR EXISTS (
                    SELECT 1 FROM project_grants g
                     WHERE g.team_id = s.team_id AND g.project_id = v_project
                       AND g.agent_id = s.agent_id))
        RETURNING recipient_id, recipient_session)
    SELECT ins.created_at,
           ARRAY(SELECT CASE WHEN owed.recipient_session = '' THEN a.name
                             ELSE a.name || '/' || owed.recipient_session END
                   FROM owed JOIN agents a ON a.team_id = p_team AND a.id = owed.recipient_id
                  ORDER BY 1)
      INTO v_created_at, v_recipients
      FROM ins;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'send not stored: not an active sender, or request_id used before'
              USING ERRCODE = 'AC001';
    END IF;

    -- The outbox slot, in the same transaction as the message (seed O2, O3),
    -- as outbox::enqueue writes it. No ON CONFLICT: the message was inserted
    -- just above, so it has no slot yet.
    IF v_publication <> 'sync' THEN
        INSERT INTO conversation_outbox
            (message_id, conversation_id, team_id, backend, payload, payload_bytes, publish_key)
        VALUES (p_id, p_conversation, p_team, v_backend, p_body, octet_length(p_body), p_publish_key);
    END IF;

    seq := v_seq;
    publication := v_publication;
    created_at := v_created_at;
    recipients := v_recipients;
    RETURN NEXT;
END
$$;

-- The receipts' key to their message. Each check was a query and a row lock on
-- the message just inserted, three per send, and it could never fail: receipts
-- are inserted only above, in the statement that inserts their message (same
-- team, same id), later writes never change a receipt's message, and messages
-- are never deleted (a lost body is tombstoned, the row stays). Measured: about
-- 4 % of the send's throughput at 16 clients.
ALTER TABLE message_receipts DROP CONSTRAINT message_receipts_team_id_message_id_fkey;
