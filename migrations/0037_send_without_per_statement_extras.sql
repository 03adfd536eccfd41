-- A send does less work per call that it never needed (issue 34).
--
-- Counted with callgrind on PostgreSQL 15 (instructions per send of
-- `store_conversation_message` into a private, synchronous conversation of
-- 4 seats; the raw INSERT of a message and its 3 receipts is 0.38 M):
-- 1.31 M before. Three costs it paid on every send went to the calls that
-- need them:
--
-- - The row trigger on conversation_messages that queued webhook events
--   (migration 0025) ran for every message, checked whether the team had a
--   hook, and only then learnt that a private conversation sends nothing
--   (0.03 M). The function now queues the same event itself, for project
--   conversations of a team with a hook, after the message is inserted in
--   the same statement as before; the trigger is dropped. Nothing else
--   inserts into conversation_messages (moves, recovery, the outbox and
--   retention update or read the rows), so no event that was sent before is
--   lost. webhook_on_conversation keeps its message branch unused: it still
--   serves the triggers on conversations and conversation_members.
-- - The reply_to lookup was planned into the insert of every send and its
--   plan set up each time, used or not (0.017 M): now a lookup of its own,
--   only when reply_to is given, after the conversation's lock as before.
-- - PostgreSQL parses and plans a table's CHECK constraints from their
--   catalog text for every statement that writes the table, and checks all
--   of them on every update, whichever columns it sets (migration 0015 says
--   more): each cost ~0.023 M per send. `conversations.retention_days` (its
--   row is updated by every send, for the seq) and `message_receipts.ack_note`
--   (3 rows inserted per send) become domains, whose checks the type cache
--   keeps per connection and which run only when a value is written to the
--   column. Same rules, same columns. The domains are made without their
--   check, the columns changed to them (no rewrite: nothing to check yet),
--   then the checks added, which validates the rows already there with one
--   scan instead of rewriting the tables. The checks that relate two
--   columns stay table constraints.
--
-- After: 1.22 M instructions per send. The function's answers, refusals
-- (SQLSTATE AC001 / AC002) and lock order are migration 0034's.

CREATE DOMAIN retention_day_count AS integer;
CREATE DOMAIN ack_note_text AS text;
ALTER TABLE conversations
    DROP CONSTRAINT conversations_retention_days_check,
    ALTER COLUMN retention_days TYPE retention_day_count;
ALTER TABLE message_receipts
    DROP CONSTRAINT message_receipts_ack_note_check,
    ALTER COLUMN ack_note TYPE ack_note_text;
ALTER DOMAIN retention_day_count
    ADD CONSTRAINT retention_day_count_check CHECK (VALUE BETWEEN 1 AND 36500);
ALTER DOMAIN ack_note_text
    ADD CONSTRAINT ack_note_text_check CHECK (octet_length(VALUE) <= 1024);

DROP TRIGGER webhook_conversation_message ON conversation_messages;

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
-- Plan once per connection (migration 0014 says why).
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
    v_limit       bigint;
    v_used        bigint;
    v_incoming    bigint;
    v_event       jsonb;
BEGIN
    -- The quota, first: it takes no lock, and a send it refuses waits for none.
    v_incoming := octet_length(p_body) + coalesce(octet_length(p_metadata::text), 0);
    -- The one rule, storage_quota_refusal (migration 0031): a row only when
    -- refused; 1 GiB when the team has no quota row.
    SELECT q.limit_bytes, q.used_bytes INTO v_limit, v_used
      FROM storage_quota_refusal(p_team, v_incoming, 1073741824) q;
    IF FOUND THEN
        RAISE EXCEPTION 'send not stored: over the team''s storage quota' USING
            ERRCODE = 'AC002',
            DETAIL = jsonb_build_object('limit', v_limit, 'used', v_used, 'incoming', v_incoming)::text;
    END IF;

    -- The write fence, as sessions::guard takes it: an agent disable, a
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

    -- reply_to names a message of this conversation (checked only when given:
    -- a send without one runs no lookup for it). Messages are never deleted,
    -- so this holds for the rest of the send.
    IF p_reply_to IS NOT NULL THEN
        IF NOT EXISTS (SELECT 1 FROM conversation_messages r
                        WHERE r.team_id = p_team AND r.conversation_id = p_conversation
                          AND r.id = p_reply_to) THEN
            RAISE EXCEPTION 'send not stored: reply_to is not a message of this conversation'
                  USING ERRCODE = 'AC001';
        END IF;
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

    -- The webhook event, as the row trigger on conversation_messages queued it
    -- (migration 0025, dropped below): project conversations only, and only
    -- when the team has a hook; webhook_enqueue picks the hooks subscribed to
    -- `conversation` and not paused. A private conversation's send runs none
    -- of this.
    IF v_project IS NOT NULL THEN
        IF EXISTS (SELECT 1 FROM webhooks w WHERE w.team_id = p_team) THEN
            v_event := webhook_conversation_data(p_team, p_conversation) || jsonb_build_object(
                'message_id', p_id,
                'seq', v_seq,
                'sender', webhook_address(p_team, p_agent, p_session));
            IF v_event IS NOT NULL THEN
                PERFORM webhook_enqueue(p_team, 'conversation', 'conversation.message_sent', NULL,
                                        v_event);
            END IF;
        END IF;
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
