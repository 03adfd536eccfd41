-- Acknowledgements owed (issue 38, item 3): a direct or channel message may
-- ask for an acknowledgement (`post_message {ack_required, ack_within_seconds}`),
-- `ack_message` records it, `list_owed` shows what is owed, and a worker fires
-- `ack.overdue` once per (message, debtor) when the due time passes.
--
-- Who owes (store/messaging/acks.rs says it in words):
-- - a DM to `agent` or to `agent/window`: that agent, once (any of its
--   windows acks it; the debt is the agent's, like the DM's read cursor);
-- - a channel message: every agent of the team that existed when it was
--   posted and is not disabled, except its sender;
-- - a conversation message: its recipients, as message_receipts say (every
--   conversation message is owed; it has no due time, so never overdue).
--
-- Posting stays one row: what is owed is derived, never written at post
-- time. `message_acks` holds the acks, and the debts are an anti-join of the
-- ack-required messages (a partial index: they are few) against it. A team
-- of N agents asked for an ack writes N rows only as they ack.
--
-- `ack_overdue_fired_at` is the worker's mark: a pass claims overdue
-- messages not yet marked (UPDATE ... RETURNING over rows locked FOR UPDATE
-- SKIP LOCKED), enqueues one `ack.overdue` delivery per debtor who has not
-- acked then, in the same statement, so a message fires once, whichever
-- replica claims it. A debtor who acks after the mark is not told again.

ALTER TABLE messages
    ADD COLUMN ack_required         boolean     NOT NULL DEFAULT false,
    ADD COLUMN ack_due_at           timestamptz,
    ADD COLUMN ack_overdue_fired_at timestamptz,
    -- NOT VALID: every existing row satisfies it, and no scan is needed.
    ADD CONSTRAINT messages_ack_due_needs_ack
        CHECK (ack_required OR (ack_due_at IS NULL AND ack_overdue_fired_at IS NULL)) NOT VALID;

-- What is owed in a team: its ack-required messages, oldest first.
CREATE INDEX messages_ack_required ON messages (team_id, created_at) WHERE ack_required;
-- The worker's claim: overdue messages not yet fired, by due time.
CREATE INDEX messages_ack_overdue_unfired ON messages (ack_due_at)
    WHERE ack_required AND ack_due_at IS NOT NULL AND ack_overdue_fired_at IS NULL;

-- One row per (message, agent) that acknowledged it: the first ack's time,
-- window and note (a repeat changes nothing).
CREATE TABLE message_acks (
    team_id     uuid        NOT NULL,
    message_id  uuid        NOT NULL,
    agent_id    uuid        NOT NULL,
    -- The window that acked ('' for a bare agent token).
    session     text        NOT NULL,
    acked_at    timestamptz NOT NULL DEFAULT now(),
    note        text        CHECK (octet_length(note) <= 1024),
    PRIMARY KEY (team_id, message_id, agent_id),
    FOREIGN KEY (team_id, message_id) REFERENCES messages (team_id, id) ON DELETE CASCADE,
    FOREIGN KEY (team_id, agent_id) REFERENCES agents (team_id, id)
);

-- The `ack` event family (ack.overdue).
ALTER TABLE webhooks DROP CONSTRAINT webhooks_events_check;
ALTER TABLE webhooks ADD CONSTRAINT webhooks_events_check
    CHECK (cardinality(events) >= 1
           AND array_position(events, NULL) IS NULL
           AND events <@ ARRAY['message', 'announcement', 'task', 'lock', 'note', 'conversation',
                               'ack']);

-- post_message with the ack request: p_ack_required, and p_ack_within (seconds
-- from now, NULL: no due time; Rust checks its range). Otherwise as 0031.
CREATE OR REPLACE FUNCTION post_message(
    p_team              uuid,
    p_agent             uuid,
    p_session           text,
    p_token             uuid,
    p_window            uuid,
    p_epoch             bigint,
    p_id                uuid,
    p_channel           text,
    p_channel_reserved  boolean,
    p_window_channel    text,
    p_recipient         text,
    p_recipient_session text,
    p_body              text,
    p_announce          boolean,
    p_question          boolean,
    p_reply_to          uuid,
    p_metadata          jsonb,
    p_incoming          bigint,
    p_quota_default     bigint,
    p_ack_required      boolean,
    p_ack_within        integer)
RETURNS TABLE (refusal text, session_epoch bigint, refused_since timestamptz,
               declined text, detail text, limit_bytes bigint, used_bytes bigint,
               message_position bigint, created_at timestamptz, channel_id uuid, channel text,
               channel_created boolean, recipient_id uuid, sender text, recipient text,
               metadata jsonb)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_channel      text := p_channel;
    v_channel_id   uuid;
    v_created      boolean := false;
    v_recipient_id uuid;
    v_project      text;
    v_position     bigint;
    v_created_at   timestamptz;
    v_metadata     jsonb;
BEGIN
    -- The write fence first, as sessions::guard takes it.
    SELECT r.refusal, r.session_epoch, r.refused_since
      INTO refusal, session_epoch, refused_since
      FROM agent_write_refusal(p_team, p_agent, p_token, p_window, p_epoch, false) r;
    IF refusal IS NOT NULL THEN
        RETURN NEXT;
        RETURN;
    END IF;

    SELECT q.limit_bytes, q.used_bytes INTO limit_bytes, used_bytes
      FROM storage_quota_refusal(p_team, p_incoming, p_quota_default) q;
    IF FOUND THEN
        declined := 'quota';
        RETURN NEXT;
        RETURN;
    END IF;

    IF v_channel IS NULL AND p_recipient IS NULL THEN
        SELECT p.project INTO v_project FROM presence p
         WHERE p.team_id = p_team AND p.agent_id = p_agent AND p.session = p_session;
        IF v_project <> '' THEN
            declined := 'project_label';
            detail := v_project;
            RETURN NEXT;
            RETURN;
        END IF;
        v_channel := p_window_channel;
        IF v_channel IS NULL THEN
            declined := 'no_default_channel';
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;

    IF v_channel IS NOT NULL THEN
        IF NOT p_channel_reserved THEN
            INSERT INTO channels AS c (id, team_id, name, created_by)
            VALUES (gen_random_uuid(), p_team, v_channel, p_agent)
            ON CONFLICT (team_id, name) DO NOTHING
            RETURNING c.id INTO v_channel_id;
            v_created := v_channel_id IS NOT NULL;
        END IF;
        IF v_channel_id IS NULL THEN
            SELECT c.id INTO v_channel_id FROM channels c
             WHERE c.team_id = p_team AND c.name = v_channel;
        END IF;
        IF v_channel_id IS NULL THEN
            declined := 'reserved_channel';
            detail := v_channel;
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;

    IF p_recipient IS NOT NULL THEN
        SELECT a.id INTO v_recipient_id FROM agents a
         WHERE a.team_id = p_team AND a.name = p_recipient;
        IF v_recipient_id IS NULL THEN
            declined := 'no_recipient';
            detail := p_recipient;
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;

    IF p_reply_to IS NOT NULL AND NOT EXISTS (
           SELECT 1 FROM messages r WHERE r.team_id = p_team AND r.id = p_reply_to) THEN
        declined := 'bad_reply_to';
        RETURN NEXT;
        RETURN;
    END IF;

    -- Last: the position (entry lock, sequence, position lock) and the
    -- message in one statement, then the channel's count on its stripe.
    INSERT INTO messages AS m (id, team_id, channel_id, sender_id, sender_session, recipient_id,
                               recipient_session, body, announce, is_question, reply_to,
                               metadata, position, ack_required, ack_due_at)
    VALUES (p_id, p_team, v_channel_id, p_agent, p_session, v_recipient_id, p_recipient_session,
            p_body, p_announce, p_question, p_reply_to, p_metadata, message_position_take(p_team),
            p_ack_required,
            CASE WHEN p_ack_required AND p_ack_within IS NOT NULL
                 THEN now() + make_interval(secs => p_ack_within) END)
    RETURNING m.position, m.created_at, m.metadata INTO v_position, v_created_at, v_metadata;
    IF v_channel_id IS NOT NULL THEN
        INSERT INTO channel_message_counts AS k (team_id, channel_id, stripe, messages)
        VALUES (p_team, v_channel_id, v_position % 16, 1)
        ON CONFLICT (team_id, channel_id, stripe) DO UPDATE SET messages = k.messages + 1;
    END IF;

    message_position := v_position;
    created_at := v_created_at;
    metadata := v_metadata;
    channel_id := v_channel_id;
    channel := v_channel;
    channel_created := v_created;
    recipient_id := v_recipient_id;
    SELECT a.name INTO sender FROM agents a WHERE a.team_id = p_team AND a.id = p_agent;
    IF p_session <> '' THEN
        sender := sender || '/' || p_session;
    END IF;
    IF p_recipient IS NOT NULL THEN
        recipient := p_recipient || coalesce('/' || p_recipient_session, '');
    END IF;
    RETURN NEXT;
END
$$;
-- The 19-argument form (a binary of before 0047 during a rolling upgrade):
-- the same post, asking no acknowledgement.
CREATE OR REPLACE FUNCTION post_message(
    p_team uuid, p_agent uuid, p_session text, p_token uuid, p_window uuid, p_epoch bigint,
    p_id uuid, p_channel text, p_channel_reserved boolean, p_window_channel text,
    p_recipient text, p_recipient_session text, p_body text, p_announce boolean,
    p_question boolean, p_reply_to uuid, p_metadata jsonb, p_incoming bigint,
    p_quota_default bigint)
RETURNS TABLE (refusal text, session_epoch bigint, refused_since timestamptz,
               declined text, detail text, limit_bytes bigint, used_bytes bigint,
               message_position bigint, created_at timestamptz, channel_id uuid, channel text,
               channel_created boolean, recipient_id uuid, sender text, recipient text,
               metadata jsonb)
LANGUAGE sql VOLATILE AS $$
    SELECT * FROM post_message(p_team, p_agent, p_session, p_token, p_window, p_epoch, p_id,
                               p_channel, p_channel_reserved, p_window_channel, p_recipient,
                               p_recipient_session, p_body, p_announce, p_question, p_reply_to,
                               p_metadata, p_incoming, p_quota_default, false, NULL::integer)
$$;

-- `ack_message` on a direct or channel message, in one round trip: the write
-- fence, the message, whether it asks this agent for an ack, the ack (once).
-- Outcomes: `no_message` (not a message of `messages`: Rust tries the
-- conversation messages), `not_asked` (it asks for no ack), `not_addressed`
-- (this agent does not owe it), `acked` with the ack (the first one's time,
-- window and note; `first` says whether this call wrote it).
CREATE FUNCTION store_message_ack(
    p_team uuid, p_agent uuid, p_token uuid, p_window uuid, p_epoch bigint,
    p_session text, p_message uuid, p_note text)
RETURNS TABLE (refusal text, session_epoch bigint, refused_since timestamptz,
               outcome text, detail jsonb)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_msg     record;
    v_kind    text;
    v_first   boolean;
    v_ack     message_acks%ROWTYPE;
BEGIN
    SELECT r.refusal, r.session_epoch, r.refused_since
      INTO refusal, session_epoch, refused_since
      FROM agent_write_refusal(p_team, p_agent, p_token, p_window, p_epoch, false) r;
    IF refusal IS NOT NULL THEN
        RETURN NEXT;
        RETURN;
    END IF;

    -- Not the body: it may be a MiB.
    SELECT m.channel_id, m.sender_id, m.recipient_id, m.created_at, m.ack_required, m.ack_due_at
      INTO v_msg
      FROM messages m WHERE m.team_id = p_team AND m.id = p_message;
    IF NOT FOUND THEN
        outcome := 'no_message';
        RETURN NEXT;
        RETURN;
    END IF;
    v_kind := CASE WHEN v_msg.channel_id IS NULL THEN 'dm' ELSE 'channel' END;
    detail := jsonb_build_object('kind', v_kind);
    IF NOT v_msg.ack_required THEN
        outcome := 'not_asked';
        RETURN NEXT;
        RETURN;
    END IF;
    -- coalesce: a channel message's recipient_id is NULL, and NOT NULL is no refusal.
    IF NOT (coalesce(v_msg.recipient_id = p_agent, false)
            OR (v_msg.channel_id IS NOT NULL AND v_msg.sender_id <> p_agent
                AND EXISTS (SELECT 1 FROM agents a
                             WHERE a.team_id = p_team AND a.id = p_agent
                               AND a.created_at <= v_msg.created_at))) THEN
        outcome := 'not_addressed';
        RETURN NEXT;
        RETURN;
    END IF;

    INSERT INTO message_acks AS k (team_id, message_id, agent_id, session, note)
    VALUES (p_team, p_message, p_agent, p_session, p_note)
    ON CONFLICT (team_id, message_id, agent_id) DO NOTHING;
    v_first := FOUND;
    SELECT * INTO v_ack FROM message_acks k
     WHERE k.team_id = p_team AND k.message_id = p_message AND k.agent_id = p_agent;
    outcome := 'acked';
    detail := jsonb_build_object(
        'kind', v_kind,
        'first', v_first,
        'acked_at', v_ack.acked_at,
        'acked_from', webhook_address(p_team, p_agent, v_ack.session),
        'note', v_ack.note,
        'due_at', v_msg.ack_due_at);
    RETURN NEXT;
END
$$;
