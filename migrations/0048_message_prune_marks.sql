-- Issue 38, item 4: never silently empty. `team prune` deletes channel and
-- direct messages that every reader has read; a read from an explicit
-- position (`read_messages {after}`) behind what it deleted would otherwise
-- answer a page with holes, or an empty one, as if nothing had been there.
-- The prune now records, in the transaction that deletes a batch, the
-- highest position it deleted per channel (kind 'channel', key the channel)
-- and per recipient agent of direct messages (kind 'direct', key the
-- agent). A read from a position below its scope's mark is refused and
-- told where the oldest kept message may start (the mark + 1).
-- Marks only rise (greatest of old and new); they are never lowered.
CREATE TABLE message_prune_marks (
    team_id         uuid        NOT NULL REFERENCES teams (id),
    kind            text        NOT NULL CHECK (kind IN ('channel', 'direct')),
    key             uuid        NOT NULL,
    pruned_through  bigint      NOT NULL CHECK (pruned_through >= 1),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (team_id, kind, key)
);
