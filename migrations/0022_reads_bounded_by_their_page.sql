-- Read tools whose cost is bounded by their page, not by the team's history
-- (issue 19): indexes that serve each listing's filter and order, and the
-- inbox top-up's marks (at the end).
--
-- list_tasks: done and cancelled tasks most recently changed first, and the
-- live claims in queue order, each read from its own index instead of
-- filtering the whole team's tasks.
CREATE INDEX tasks_team_status_updated ON tasks (team_id, status, updated_at, seq);
CREATE INDEX tasks_claimed_queue ON tasks (team_id, created_at, seq) WHERE status = 'claimed';

-- list_notes of one scope, most recently updated first.
CREATE INDEX notes_team_scope_updated ON notes (team_id, scope, updated_at DESC)
    WHERE deleted_at IS NULL;

-- fetch_conversation_inbox hands out references per conversation in seq
-- order, conversations by their oldest owed reference: both read here per
-- conversation, a page at a time, instead of ranking everything owed.
CREATE INDEX inbox_references_owed_order
    ON inbox_references (team_id, recipient_key, conversation_id, seq, kind, id)
    WHERE delivered_at IS NULL;
CREATE INDEX inbox_references_owed_first
    ON inbox_references (team_id, recipient_key, conversation_id, created_at)
    WHERE delivered_at IS NULL;
-- conversation_inbox_status: references handed out in the last minute.
CREATE INDEX inbox_references_handed_out
    ON inbox_references (team_id, recipient_key, handed_out_at)
    WHERE delivered_at IS NULL AND handed_out_at IS NOT NULL;
-- The receipts a seat has not been delivered yet (where the inbox top-up
-- starts, and the status counts), found by seat instead of among every
-- receipt of the team; ordered by message so a bounded read uses it.
CREATE INDEX message_receipts_undelivered
    ON message_receipts (team_id, member_id, message_id)
    WHERE delivered_at IS NULL;

-- How far the inbox top-up (fetch_conversation_inbox) has walked a seat's
-- conversation for one recipient window: every message up to through_seq
-- has had its reference queued if this seat's receipt was owed. The walk
-- goes on from here a bounded step per fetch, instead of sorting every
-- receipt the window has not been delivered. A seat without a mark starts
-- just before its oldest undelivered receipt. Marks are dropped when a
-- transfer moves receipts onto a seat and when references owed to a dead
-- window are released, so the walk starts again from what is owed.
CREATE TABLE inbox_topup_marks (
    team_id       uuid   NOT NULL,
    member_id     uuid   NOT NULL,
    recipient_key text   NOT NULL CHECK (recipient_key ~ '^[0-9a-f]{32}$'),
    through_seq   bigint NOT NULL CHECK (through_seq >= 0),
    PRIMARY KEY (team_id, member_id, recipient_key),
    FOREIGN KEY (team_id, member_id) REFERENCES conversation_members (team_id, id)
);
CREATE INDEX inbox_topup_marks_key ON inbox_topup_marks (team_id, recipient_key);
