-- Outgoing webhooks (issue 20, item 3): a team's hooks, and one delivery row
-- per (event, matching hook), written by triggers in the transaction of the
-- change itself. So a delivery exists exactly when its change committed
-- (never for a rolled-back one), once, however many replicas run; the
-- dispatcher of any replica (src/workers/webhook_dispatcher.rs) claims rows
-- with FOR UPDATE SKIP LOCKED and a lease.
--
-- What a trigger never enqueues: a direct message (messages.recipient_id set),
-- anything about a private conversation (its existence and cadence belong to
-- its members, and a hook's receiver is not one), any conversation message
-- body (only its id, seq, conversation, title and sender), a note's value
-- (notes are the team's working memory and may hold what nobody meant to
-- broadcast; the key, the action and the author say what changed), a task's
-- result or description.
--
-- Cost for a team without hooks: each trigger starts with one EXISTS on
-- webhooks_team (an index of a table with a handful of rows), before any
-- other work. Posting is hot: messages' trigger runs inside the statement
-- that holds the team's message counter (0021), so it must stay that cheap.

CREATE TABLE webhooks (
    id             uuid        PRIMARY KEY,
    team_id        uuid        NOT NULL REFERENCES teams (id),
    url            text        NOT NULL CHECK (octet_length(url) BETWEEN 1 AND 2048),
    kind           text        NOT NULL CHECK (kind IN ('generic', 'slack', 'discord')),
    -- The event families the hook receives.
    events         text[]      NOT NULL
                               CHECK (cardinality(events) >= 1
                                      AND array_position(events, NULL) IS NULL
                                      AND events <@ ARRAY['message', 'announcement', 'task',
                                                          'lock', 'note', 'conversation']),
    -- Channel names narrowing message and announcement events; NULL: every channel.
    channels       text[]      CHECK (channels IS NULL
                                      OR (cardinality(channels) BETWEEN 1 AND 32
                                          AND array_position(channels, NULL) IS NULL)),
    -- The HMAC key of generic deliveries. Kept in clear because the server
    -- must sign with it; shown to the operator once, at creation, and never
    -- listed.
    secret         text        NOT NULL CHECK (octet_length(secret) >= 32),
    -- The operator allowed a private, loopback or link-local address
    -- (`--allow-private`); otherwise the dispatcher re-checks the resolved
    -- address at every send.
    allow_private  boolean     NOT NULL DEFAULT false,
    created_by     text        NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    UNIQUE (team_id, id)
);
CREATE INDEX webhooks_team ON webhooks (team_id);

CREATE TABLE webhook_deliveries (
    -- The delivery id the receiver de-duplicates on (X-Bus-Delivery).
    id               uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    team_id          uuid        NOT NULL,
    webhook_id       uuid        NOT NULL,
    -- `task.claimed`, `message.posted`, ...
    event            text        NOT NULL CHECK (octet_length(event) BETWEEN 1 AND 64),
    -- The event's `data`, shaped by the trigger; never a DM, never a
    -- conversation body.
    payload          jsonb       NOT NULL CHECK (jsonb_typeof(payload) = 'object'),
    state            text        NOT NULL DEFAULT 'pending'
                                 CHECK (state IN ('pending', 'delivering', 'delivered', 'failed')),
    attempts         integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    -- pending: when the next try is due; delivering: when the lease lapses
    -- (a replica that died mid-send leaves the row to be claimed again then).
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    -- Who holds the lease: a settle that does not name it changes nothing.
    lease_id         uuid,
    last_error       text,
    last_status      integer,
    created_at       timestamptz NOT NULL DEFAULT now(),
    delivered_at     timestamptz,
    CHECK ((state = 'delivering') = (lease_id IS NOT NULL)),
    CHECK ((state = 'delivered') = (delivered_at IS NOT NULL)),
    FOREIGN KEY (team_id, webhook_id) REFERENCES webhooks (team_id, id) ON DELETE CASCADE
);
-- The claim: due rows, oldest due first.
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at)
    WHERE state IN ('pending', 'delivering');
-- `webhook list`: counts by state per hook, the newest failure.
CREATE INDEX webhook_deliveries_hook ON webhook_deliveries (webhook_id, state, created_at);
-- The dispatcher's hourly prune of old delivered rows.
CREATE INDEX webhook_deliveries_delivered ON webhook_deliveries (delivered_at)
    WHERE state = 'delivered';

-- One delivery per hook of the team that subscribes to `family` (and, for
-- channel events, to `channel`).
CREATE FUNCTION webhook_enqueue(p_team uuid, p_family text, p_event text, p_channel text,
                                p_data jsonb)
RETURNS void LANGUAGE sql VOLATILE AS $$
    INSERT INTO webhook_deliveries (team_id, webhook_id, event, payload)
    SELECT w.team_id, w.id, p_event, p_data
    FROM webhooks w
    WHERE w.team_id = p_team
      AND p_family = ANY (w.events)
      AND (p_channel IS NULL OR w.channels IS NULL OR p_channel = ANY (w.channels))
$$;

-- An agent's name, or its address `name/window`, as payloads show it.
CREATE FUNCTION webhook_address(p_team uuid, p_agent uuid, p_session text)
RETURNS text LANGUAGE sql STABLE AS $$
    SELECT a.name || CASE WHEN coalesce(p_session, '') = '' THEN '' ELSE '/' || p_session END
    FROM agents a WHERE a.team_id = p_team AND a.id = p_agent
$$;

-- Channel posts and announcements; never a direct message.
CREATE FUNCTION webhook_on_message() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_channel text;
BEGIN
    IF NEW.recipient_id IS NOT NULL
       OR NOT EXISTS (SELECT 1 FROM webhooks WHERE team_id = NEW.team_id) THEN
        RETURN NULL;
    END IF;
    SELECT name INTO v_channel FROM channels WHERE team_id = NEW.team_id AND id = NEW.channel_id;
    PERFORM webhook_enqueue(
        NEW.team_id,
        CASE WHEN NEW.announce THEN 'announcement' ELSE 'message' END,
        CASE WHEN NEW.announce THEN 'announcement.posted' ELSE 'message.posted' END,
        v_channel,
        jsonb_build_object(
            'message_id', NEW.id,
            'channel', v_channel,
            'sender', webhook_address(NEW.team_id, NEW.sender_id, NEW.sender_session),
            'position', NEW.position,
            'announce', NEW.announce,
            'is_question', NEW.is_question,
            'reply_to', NEW.reply_to,
            'body', left(NEW.body, 4000),
            'body_truncated', length(NEW.body) > 4000));
    RETURN NULL;
END
$$;
CREATE TRIGGER webhook_message AFTER INSERT ON messages
    FOR EACH ROW EXECUTE FUNCTION webhook_on_message();

-- Every task event but `renewed` (a lease heartbeat, not news).
CREATE FUNCTION webhook_on_task_event() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_task tasks%ROWTYPE;
BEGIN
    IF NEW.kind = 'renewed'
       OR NOT EXISTS (SELECT 1 FROM webhooks WHERE team_id = NEW.team_id) THEN
        RETURN NULL;
    END IF;
    SELECT * INTO v_task FROM tasks WHERE team_id = NEW.team_id AND id = NEW.task_id;
    PERFORM webhook_enqueue(
        NEW.team_id, 'task', 'task.' || NEW.kind, NULL,
        jsonb_build_object(
            'task_id', NEW.task_id,
            'key', v_task.key,
            'title', v_task.title,
            'status', v_task.status,
            'by', webhook_address(NEW.team_id, NEW.agent_id, NEW.session),
            'detail', NEW.detail));
    RETURN NULL;
END
$$;
CREATE TRIGGER webhook_task_event AFTER INSERT ON task_events
    FOR EACH ROW EXECUTE FUNCTION webhook_on_task_event();

-- A lock taken (a new row, or an expired row taken over in place) or
-- released (the row deleted). Extending one's own lock is not news.
CREATE FUNCTION webhook_on_lock() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_row locks%ROWTYPE;
    v_event text;
BEGIN
    IF TG_OP = 'DELETE' THEN
        v_row := OLD;
        v_event := 'lock.released';
    ELSE
        v_row := NEW;
        v_event := 'lock.acquired';
        IF TG_OP = 'UPDATE' AND NEW.acquired_at = OLD.acquired_at
           AND NEW.holder_agent_id = OLD.holder_agent_id
           AND NEW.holder_session = OLD.holder_session THEN
            RETURN NULL;
        END IF;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM webhooks WHERE team_id = v_row.team_id) THEN
        RETURN NULL;
    END IF;
    PERFORM webhook_enqueue(
        v_row.team_id, 'lock', v_event, NULL,
        jsonb_build_object(
            'name', v_row.name,
            'holder', webhook_address(v_row.team_id, v_row.holder_agent_id, v_row.holder_session),
            'purpose', v_row.purpose,
            'expires_at', v_row.expires_at));
    RETURN NULL;
END
$$;
CREATE TRIGGER webhook_lock AFTER INSERT OR UPDATE OR DELETE ON locks
    FOR EACH ROW EXECUTE FUNCTION webhook_on_lock();

-- A note set or deleted: its scope, key, revision, author and size; never
-- its value (see the top of this file).
CREATE FUNCTION webhook_on_note_revision() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_note notes%ROWTYPE;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM webhooks WHERE team_id = NEW.team_id) THEN
        RETURN NULL;
    END IF;
    SELECT * INTO v_note FROM notes WHERE team_id = NEW.team_id AND id = NEW.note_id;
    PERFORM webhook_enqueue(
        NEW.team_id, 'note', 'note.' || NEW.action, NULL,
        jsonb_build_object(
            'scope', v_note.scope,
            'key', v_note.key,
            'revision', NEW.revision,
            'action', NEW.action,
            'value_bytes', octet_length(NEW.value),
            'tags', to_jsonb(NEW.tags),
            'by', webhook_address(NEW.team_id, NEW.author_agent_id, NEW.author_session)));
    RETURN NULL;
END
$$;
CREATE TRIGGER webhook_note_revision AFTER INSERT ON note_revisions
    FOR EACH ROW EXECUTE FUNCTION webhook_on_note_revision();

-- Project conversations only: created, a member joined, a message sent
-- (metadata only: never a body).
CREATE FUNCTION webhook_conversation_data(p_team uuid, p_conversation uuid)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('conversation_id', c.id, 'title', c.title, 'project', p.name)
    FROM conversations c JOIN projects p ON p.team_id = c.team_id AND p.id = c.project_id
    WHERE c.team_id = p_team AND c.id = p_conversation AND c.visibility = 'project'
$$;

CREATE FUNCTION webhook_on_conversation() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_data jsonb;
    v_event text;
BEGIN
    -- Nested, not ANDed: PL/pgSQL resolves every field an expression names,
    -- and only seat rows have a state.
    IF TG_TABLE_NAME = 'conversation_members' THEN
        IF NOT (NEW.state = 'active' AND OLD.state <> 'active') THEN
            RETURN NULL;
        END IF;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM webhooks WHERE team_id = NEW.team_id) THEN
        RETURN NULL;
    END IF;
    IF TG_TABLE_NAME = 'conversations' THEN
        v_data := webhook_conversation_data(NEW.team_id, NEW.id);
        v_event := 'conversation.created';
        v_data := v_data || jsonb_build_object(
            'by', webhook_address(NEW.team_id, NEW.created_by, NEW.created_session));
    ELSIF TG_TABLE_NAME = 'conversation_members' THEN
        v_data := webhook_conversation_data(NEW.team_id, NEW.conversation_id);
        v_event := 'conversation.member_joined';
        v_data := v_data || jsonb_build_object(
            'member', webhook_address(NEW.team_id, NEW.agent_id, NEW.session),
            'role', NEW.role);
    ELSE
        v_data := webhook_conversation_data(NEW.team_id, NEW.conversation_id);
        v_event := 'conversation.message_sent';
        v_data := v_data || jsonb_build_object(
            'message_id', NEW.id,
            'seq', NEW.seq,
            'sender', webhook_address(NEW.team_id, NEW.sender_id, NEW.sender_session));
    END IF;
    -- NULL: a private conversation (or none): nothing leaves the bus.
    IF v_data IS NULL THEN
        RETURN NULL;
    END IF;
    PERFORM webhook_enqueue(NEW.team_id, 'conversation', v_event, NULL, v_data);
    RETURN NULL;
END
$$;
CREATE TRIGGER webhook_conversation AFTER INSERT ON conversations
    FOR EACH ROW EXECUTE FUNCTION webhook_on_conversation();
CREATE TRIGGER webhook_conversation_member AFTER UPDATE OF state ON conversation_members
    FOR EACH ROW EXECUTE FUNCTION webhook_on_conversation();
CREATE TRIGGER webhook_conversation_message AFTER INSERT ON conversation_messages
    FOR EACH ROW EXECUTE FUNCTION webhook_on_conversation();
