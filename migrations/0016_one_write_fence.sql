-- One rule for "may this agent credential write now" (issue 13, item 1).
--
-- Before: sessions::guard took the session row FOR SHARE and read the agent
-- and the token in the same statement, and `agent disable` / `token revoke`
-- locked only the session rows. A guard that waited on that lock still read
-- `disabled_at` from the snapshot its statement took before the wait, and a
-- bare agent token locked nothing at all: a write that started before a
-- disable could commit after it.
--
-- Now every writer's transaction starts with agent_write_refusal(), and the
-- send function calls the same one:
--   1. lock_agent_credentials(agent, shared): a transaction-scoped advisory
--      lock on the agent. Every change that takes a credential away (agent
--      disable, token revoke, revoke/resume/renew of a window) takes it
--      exclusively first, so it waits for the writes in flight, and a write
--      that starts meanwhile waits for it to commit. Shared advisory locks
--      touch no row (no tuple lock, no WAL), so the agent's windows never
--      queue behind each other.
--   2. agent_credential_refusal(): in a statement whose snapshot is taken
--      after the lock (the function is VOLATILE), so it sees every
--      revocation that committed before the write got the lock.
-- The refusal is a code; Rust (store/sessions.rs) turns it into words.
-- Authentication uses agent_credential_refusal() too, without the lock.
--
-- Admin credentials (acsa_…) get the same shape on their own key: a revoke
-- takes it exclusively, and every admin write (it is always audited) takes it
-- shared and re-reads the credential in audit::record.

-- The advisory lock's first key is the class (ASCII 'ACSa' for agents, 'ACSc'
-- for admin credentials); the second a hash of the id. A collision only makes
-- two agents' revocations wait for each other's writes: never a wrong answer.
CREATE FUNCTION lock_agent_credentials(p_agent uuid, p_exclusive boolean)
RETURNS void LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF p_exclusive THEN
        PERFORM pg_advisory_xact_lock(1094931297, hashtext(p_agent::text));
    ELSE
        PERFORM pg_advisory_xact_lock_shared(1094931297, hashtext(p_agent::text));
    END IF;
END
$$;

CREATE FUNCTION lock_admin_credential(p_credential uuid, p_exclusive boolean)
RETURNS void LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF p_exclusive THEN
        PERFORM pg_advisory_xact_lock(1094931299, hashtext(p_credential::text));
    ELSE
        PERFORM pg_advisory_xact_lock_shared(1094931299, hashtext(p_credential::text));
    END IF;
END
$$;

-- Why this credential may not act now (NULL: it may). p_window/p_epoch are
-- the session credential's row and the epoch the caller holds (NULL with a
-- bare agent token; a NULL epoch asks for no epoch fence). Codes:
--   token_unknown, token_revoked, agent_disabled, session_unknown,
--   session_token_revoked, session_revoked, session_expired, stale_epoch.
-- session_epoch is the window's current epoch; refused_since when the token or
-- the window was revoked.
CREATE FUNCTION agent_credential_refusal(
    p_team uuid, p_agent uuid, p_token uuid, p_window uuid, p_epoch bigint)
RETURNS TABLE (refusal text, session_epoch bigint, refused_since timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT CASE
               WHEN t.id IS NULL OR a.id IS NULL THEN
                   CASE WHEN p_window IS NULL THEN 'token_unknown' ELSE 'session_unknown' END
               WHEN p_window IS NULL AND t.revoked_at IS NOT NULL THEN 'token_revoked'
               WHEN a.disabled_at IS NOT NULL THEN 'agent_disabled'
               WHEN p_window IS NULL THEN NULL
               WHEN s.id IS NULL THEN 'session_unknown'
               WHEN t.revoked_at IS NOT NULL THEN 'session_token_revoked'
               WHEN s.revoked_at IS NOT NULL THEN 'session_revoked'
               WHEN s.expires_at <= now() THEN 'session_expired'
               WHEN s.epoch <> p_epoch THEN 'stale_epoch'
           END,
           s.epoch,
           coalesce(s.revoked_at, t.revoked_at)
      FROM (SELECT 1) AS one
      LEFT JOIN agent_tokens t ON t.team_id = p_team AND t.id = p_token AND t.agent_id = p_agent
      LEFT JOIN agents a ON a.team_id = p_team AND a.id = p_agent
      LEFT JOIN agent_sessions s ON p_window IS NOT NULL AND s.team_id = p_team AND s.id = p_window
                                AND s.agent_id = p_agent AND s.token_id = p_token
$$;

-- The fence every writer takes first in its transaction. p_exclusive is for a
-- window changing its own session row (renew, resume, revoke_session).
CREATE FUNCTION agent_write_refusal(
    p_team uuid, p_agent uuid, p_token uuid, p_window uuid, p_epoch bigint, p_exclusive boolean)
RETURNS TABLE (refusal text, session_epoch bigint, refused_since timestamptz)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM lock_agent_credentials(p_agent, p_exclusive);
    -- A new statement, so a new snapshot: it sees what committed while we waited.
    RETURN QUERY SELECT * FROM agent_credential_refusal(p_team, p_agent, p_token, p_window, p_epoch);
END
$$;

-- The admin fence: refusal NULL while the credential is live, else
-- admin_revoked (with refused_since) or admin_unknown.
CREATE FUNCTION admin_write_refusal(p_credential uuid)
RETURNS TABLE (refusal text, refused_since timestamptz)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM lock_admin_credential(p_credential, false);
    -- A new statement, so a new snapshot: it sees what committed while we waited.
    RETURN QUERY
        SELECT CASE WHEN c.id IS NULL THEN 'admin_unknown'
                    WHEN c.revoked_at IS NOT NULL THEN 'admin_revoked' END,
               c.revoked_at
          FROM (SELECT 1) AS one
          LEFT JOIN admin_credentials c ON c.id = p_credential;
END
$$;

-- The send (migration 0014) with the fence in place of its own session read:
-- the same rule as every other writer. The token and agent re-reads after the
-- conversation lock are gone: the fence's lock keeps a disable or a revocation
-- from committing until this send has.
CREATE OR REPLACE FUNCTION store_conversation_message(
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
    -- The write fence first, as sessions::guard takes it: an agent disable, a
    -- token revocation or a revoke/resume of this window waits for this send,
    -- or this send for it and then sees it.
    IF EXISTS (SELECT 1 FROM agent_write_refusal(p_team, p_agent, p_token, p_window, p_epoch, false) r
                WHERE r.refusal IS NOT NULL) THEN
        RAISE EXCEPTION 'send not stored: the credential may not write' USING ERRCODE = 'AC001';
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
    -- the sender's seat as it is now, the frozen recipient
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
           -- A bare token naming a window that is registered with a session
           -- credential is refused: that window speaks with its credential.
         WHERE (p_window IS NOT NULL OR p_session = '' OR NOT EXISTS (
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
