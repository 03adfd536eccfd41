-- Issue 15, item 4: lost is lost, and said once, the same way every time.
--
-- A JetStream stream deleted and created again under the same name starts
-- over at sequence 1, so an old locator `jetstream:<stream>:<seq>` may name
-- nothing, or another message, and neither answer says the body is lost.
-- What does say it is the stream's identity: the broker's creation time of
-- the stream (`created` in its info), which a re-created stream changes and a
-- restart or a restore from a snapshot keeps.
--
-- `team_streams` holds the identity the bus last saw for each stream of a
-- team, recorded by `team stream` when it provisions or adopts the stream.
CREATE TABLE team_streams (
    team_id           uuid        NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    stream            text        NOT NULL,
    created_at_broker timestamptz NOT NULL,
    recorded_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (team_id, stream)
);

-- The identity of the stream a message's locator was written under: NULL
-- when the bus had none recorded for it (streams provisioned before this
-- migration, or never through `team stream`), which means "unknown", never
-- "the same".
ALTER TABLE conversation_messages ADD COLUMN stream_created_at timestamptz;

-- Set by the database whenever a locator is written, whoever writes it (the
-- drain's confirmation, the reconciler, a move's cutover): one rule in one
-- place, so no writer can forget it. The identity stamped is the one
-- recorded at that moment; a publish that lands in a stream re-created a
-- moment before `team stream` records it is stamped with the old identity,
-- which is why a reader asks the broker once before calling such a body
-- lost (src/store/lost_bodies.rs).
CREATE FUNCTION stamp_locator_stream() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.stream_created_at := CASE
        WHEN NEW.canonical_locator LIKE 'jetstream:%' THEN (
            SELECT s.created_at_broker
              FROM team_streams s
             WHERE s.team_id = NEW.team_id
               AND s.stream = split_part(NEW.canonical_locator, ':', 2))
        END;
    RETURN NEW;
END
$$;

CREATE TRIGGER conversation_messages_stamp_locator_stream
    BEFORE UPDATE OF canonical_locator ON conversation_messages
    FOR EACH ROW
    WHEN (NEW.canonical_locator IS DISTINCT FROM OLD.canonical_locator)
    EXECUTE FUNCTION stamp_locator_stream();
