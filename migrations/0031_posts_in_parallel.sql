-- A team's posts commit in parallel (issue 34 item 2), and a post without
-- attachments is one round trip (item 1).
--
-- Before: every post took the team's `message_counters` row and held it
-- through COMMIT, and updated its channel's counters in the same statement,
-- so a team's posts (and a channel's) committed one at a time. Positions
-- were 1..N without gaps and committed in order, so a reader never had to
-- wait (migration 0021).
--
-- Now a position comes from the team's own sequence, taken in the statement
-- that inserts the message, so positions no longer commit in order and a
-- rolled-back post leaves a gap. What a writer takes, in this order, in that
-- one statement (message_position_take):
--   1. the team's entry lock, SHARED (advisory, class 'ACSm', key the team):
--      every writer of the team holds it from before its position until its
--      commit; writers never wait for each other on it;
--   2. nextval of the team's sequence;
--   3. the position's lock, EXCLUSIVE (advisory, one bigint key made of the
--      team's hash and the position: the one-key space, which no other lock of
--      ours uses but the migrator's single key), held to the commit.
-- A reader (store/messages/read.rs) that finds positions missing below the
-- newest one it would return waits for each missing position's writer by
-- taking and releasing its lock (message_positions_wait below), reads again,
-- and only for a position still missing whose lock was free waits once for
-- the team's entry lock EXCLUSIVE: that waits for the team's writers in flight
-- and no one else, and every writer that took a position below the newest
-- visible one took the entry lock before it (1 before 2), so after that wait
-- each missing position is committed (the next read sees it) or gone for
-- good (rolled back, or never handed out: a sequence skips values after a
-- crash). So a cursor never passes a message that commits late (issue 19's
-- guarantee a), and a read waits only for writers of its own team (b).
--
-- Channel counters no longer sit on the channel row (every post of a channel
-- would queue on it through COMMIT): a post adds one to one of 16 stripes of
-- channel_message_counts picked by its position, so posts in flight together
-- (consecutive positions) rarely share a stripe. A channel holds
-- channels.message_count (kept for history seeded or counted before this
-- migration; prune no longer lowers it) plus the sum of its stripes; its
-- newest message's time is read from the position index.

-- The team's position sequence, by name (one sequence per team, created with
-- the team: a sequence hands out values without holding anything to COMMIT).
CREATE FUNCTION message_position_sequence(p_team uuid) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT 'message_positions_' || replace(p_team::text, '-', '')
$$;

CREATE FUNCTION create_message_position_sequence() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('CREATE SEQUENCE %I AS bigint MINVALUE 1', message_position_sequence(NEW.id));
    RETURN NEW;
END
$$;

CREATE TRIGGER teams_message_position_sequence AFTER INSERT ON teams
    FOR EACH ROW EXECUTE FUNCTION create_message_position_sequence();

-- Existing teams continue after their counter (every position up to it has
-- committed: the counter row was the allocator).
DO $$
DECLARE
    t record;
BEGIN
    FOR t IN SELECT tm.id, greatest(coalesce(k.last_position, 0),
                                    coalesce((SELECT max(m.position) FROM messages m
                                               WHERE m.team_id = tm.id), 0)) AS last
               FROM teams tm LEFT JOIN message_counters k ON k.team_id = tm.id LOOP
        EXECUTE format('CREATE SEQUENCE %I AS bigint MINVALUE 1', message_position_sequence(t.id));
        IF t.last > 0 THEN
            PERFORM setval(message_position_sequence(t.id)::regclass, t.last);
        END IF;
    END LOOP;
END
$$;

-- message_counters is no longer written by posts. A write of its
-- last_position (a set-based seed of history, as the benchmark and tests do,
-- which number their messages from it) moves the team's sequence past it, so
-- the next post continues after the seeded history.
CREATE FUNCTION message_counters_raise_sequence() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_seq regclass := message_position_sequence(NEW.team_id)::regclass;
    v_last bigint;
BEGIN
    EXECUTE format('SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM %s', v_seq)
       INTO v_last;
    IF NEW.last_position > v_last THEN
        PERFORM setval(v_seq, NEW.last_position);
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER message_counters_raise_sequence AFTER INSERT OR UPDATE ON message_counters
    FOR EACH ROW EXECUTE FUNCTION message_counters_raise_sequence();

-- The key of a position's lock: the team's hash in the high half, the
-- position's low 32 bits in the low half. Two positions sharing a key (2^32
-- apart, or two teams' hashes colliding) only make a reader wait for a
-- writer it did not need: never a wrong answer.
CREATE FUNCTION message_position_key(p_team uuid, p_position bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT (hashtext(p_team::text)::bigint << 32) | (p_position & 4294967295)
$$;

-- The writer's side, in the statement that inserts the message: entry lock
-- shared, then the position, then the position's lock (see the top).
CREATE FUNCTION message_position_take(p_team uuid) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_position bigint;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(1094931309, hashtext(p_team::text));
    v_position := nextval(message_position_sequence(p_team)::regclass);
    PERFORM pg_advisory_xact_lock(message_position_key(p_team, v_position));
    RETURN v_position;
END
$$;

-- The reader's side: return once every position of p_gaps (positions of the
-- team missing from what the reader saw, all below a position it saw) is
-- committed or gone for good; the caller then reads again (a new statement
-- sees what committed meanwhile).
CREATE FUNCTION message_positions_wait(p_team uuid, p_gaps bigint[]) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_gap bigint;
BEGIN
    -- Each gap's writer, if it holds its position: wait for its commit or
    -- rollback. Taken and released at once (session level), so this reader
    -- holds no position lock when it waits for the entry lock below (a writer
    -- between its nextval and its position lock would otherwise wait for it).
    FOREACH v_gap IN ARRAY p_gaps LOOP
        PERFORM pg_advisory_lock_shared(message_position_key(p_team, v_gap));
        PERFORM pg_advisory_unlock_shared(message_position_key(p_team, v_gap));
    END LOOP;
    -- A new statement, so a new snapshot. A gap still missing had no writer
    -- holding it: gone, or a writer between its nextval and its lock. That
    -- writer holds the team's entry lock, so waiting for the entry lock
    -- exclusively waits for it (and for the team's other writers in flight,
    -- no one else). Held to this reader's commit, which follows its next read.
    IF EXISTS (SELECT 1 FROM unnest(p_gaps) AS g(position)
                WHERE NOT EXISTS (SELECT 1 FROM messages m
                                   WHERE m.team_id = p_team AND m.position = g.position)) THEN
        PERFORM pg_advisory_xact_lock(1094931309, hashtext(p_team::text));
    END IF;
END
$$;

-- Per-channel counts in stripes (see the top).
CREATE TABLE channel_message_counts (
    team_id     uuid     NOT NULL,
    channel_id  uuid     NOT NULL,
    stripe      smallint NOT NULL CHECK (stripe BETWEEN 0 AND 15),
    messages    bigint   NOT NULL,
    PRIMARY KEY (team_id, channel_id, stripe),
    FOREIGN KEY (team_id, channel_id) REFERENCES channels (team_id, id)
);

-- The storage quota's rule, in SQL for the writes that check it inside
-- their one statement: a write of p_incoming bytes is refused when the
-- team's last counted usage plus it passes the limit (store/usage.rs words
-- the refusal). A row is returned only when it is refused.
CREATE FUNCTION storage_quota_refusal(p_team uuid, p_incoming bigint, p_default_limit bigint)
RETURNS TABLE (limit_bytes bigint, used_bytes bigint)
LANGUAGE sql STABLE AS $$
    SELECT l.limit_bytes, l.used_bytes
      FROM (SELECT coalesce(q.attachment_bytes_limit, p_default_limit) AS limit_bytes,
                   coalesce(q.storage_bytes_used, 0) AS used_bytes
              FROM (SELECT 1) AS one
              LEFT JOIN team_quotas q ON q.team_id = p_team) l
     WHERE l.used_bytes + p_incoming > l.limit_bytes
$$;

-- post_message in one call: the write fence, the quota, the default channel,
-- the channel (found or created), the recipient, reply_to, then the message
-- at a new position. A refusal is a row with `refusal` (the fence's code and
-- its fields, as agent_write_refusal returns them) or `declined` (this
-- function's: quota, project_label, reserved_channel, no_recipient,
-- bad_reply_to) and nothing written; Rust (store/messages/post.rs) words it.
--
-- p_channel: the channel named (normalised by Rust), or NULL for a direct
-- message (p_recipient set) or for the window's default channel. The default
-- is the window's `project` label if it has one, else p_window_channel (the
-- window label's channel, from Rust). A project label is returned as
-- `declined = project_label` with the label in `detail`: Rust normalises it
-- (the one channel-name rule) and calls again naming the channel.
-- p_channel_reserved: the name is one read_messages takes as a scope, so the
-- channel is found, never created.
CREATE FUNCTION post_message(
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
    p_quota_default     bigint)
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
                               metadata, position)
    VALUES (p_id, p_team, v_channel_id, p_agent, p_session, v_recipient_id, p_recipient_session,
            p_body, p_announce, p_question, p_reply_to, p_metadata, message_position_take(p_team))
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

-- A prune lowers channels.message_count by what it removed without touching
-- the stripes (a post takes its stripe before the quota row its attachments
-- lock, a prune the quota row first: one order each way would deadlock), so
-- the row's part may go below zero while the channel's total does not.
ALTER TABLE channels DROP CONSTRAINT channels_message_count_check;
