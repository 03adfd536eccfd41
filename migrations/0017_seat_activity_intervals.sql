-- When each seat was active, as ranges of seq.
--
-- Recovery (`recover_conversation_history`) read from the lowest history
-- boundary any seat of the agent ever had, with no end: a window removed at
-- seq 3 recovered everything sent after its removal. What an agent is
-- entitled to is what one of its seats could read while it was active: from
-- the seat's history boundary when it became active to the conversation's
-- last seq when it stopped being active (left, removed, or superseded by a
-- transfer). A seat may leave and come back several times, so these are
-- intervals, one row per activation.
--
-- A trigger writes them, so the interval changes in the same transaction as
-- the seat's state, whichever statement changes it. Every seat state change
-- holds the conversation row (`FOR UPDATE`, the lock every writer takes
-- first, and the one a send takes to allocate its seq), so `last_seq` read
-- here is exactly the last message the seat was a recipient of or could read
-- as active: no send commits between the read and the state change.
--
-- A transfer moves the seat to another window of the same agent: the old
-- seat's interval closes, the new seat opens one from the same boundary;
-- both belong to the agent, so recovery (which reads all of the agent's
-- seats) keeps them.

CREATE TABLE conversation_seat_activity (
    team_id          uuid   NOT NULL,
    conversation_id  uuid   NOT NULL,
    member_id        uuid   NOT NULL,
    -- The seat's history boundary when it became active.
    from_seq         bigint NOT NULL CHECK (from_seq >= 1),
    -- The conversation's last seq when it stopped being active; NULL while
    -- active. An activation that saw no message has to_seq = from_seq - 1.
    to_seq           bigint CHECK (to_seq IS NULL OR to_seq >= from_seq - 1),
    FOREIGN KEY (team_id, conversation_id, member_id)
        REFERENCES conversation_members (team_id, conversation_id, id)
);
CREATE INDEX conversation_seat_activity_member
    ON conversation_seat_activity (team_id, member_id);
-- One open activation per seat.
CREATE UNIQUE INDEX conversation_seat_activity_open
    ON conversation_seat_activity (team_id, member_id) WHERE to_seq IS NULL;

CREATE FUNCTION conversation_seat_activity_track() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    was_active boolean := false;
    is_active  boolean := NEW.state = 'active';
BEGIN
    IF TG_OP = 'UPDATE' THEN
        was_active := OLD.state = 'active';
    END IF;
    IF was_active AND NOT is_active THEN
        UPDATE conversation_seat_activity a
           SET to_seq = greatest(c.last_seq, a.from_seq - 1)
          FROM conversations c
         WHERE c.team_id = NEW.team_id AND c.id = NEW.conversation_id
           AND a.team_id = NEW.team_id AND a.member_id = NEW.id AND a.to_seq IS NULL;
    ELSIF is_active AND NOT was_active THEN
        INSERT INTO conversation_seat_activity (team_id, conversation_id, member_id, from_seq)
        VALUES (NEW.team_id, NEW.conversation_id, NEW.id, NEW.history_from_seq);
    ELSIF is_active THEN
        IF NEW.history_from_seq <> OLD.history_from_seq THEN
            -- No writer moves an active seat's boundary today; if one ever
            -- does, the activation follows it rather than keep the old range.
            UPDATE conversation_seat_activity
               SET from_seq = NEW.history_from_seq
             WHERE team_id = NEW.team_id AND member_id = NEW.id AND to_seq IS NULL;
        END IF;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER conversation_seat_activity_track
    AFTER INSERT OR UPDATE OF state, history_from_seq ON conversation_members
    FOR EACH ROW EXECUTE FUNCTION conversation_seat_activity_track();

-- Backfill.
--
-- An active seat: one open activation from its history boundary (earlier
-- activations of a seat that left and came back are not known: the seat
-- rows kept only the latest boundary, so they are not granted).
INSERT INTO conversation_seat_activity (team_id, conversation_id, member_id, from_seq)
SELECT team_id, conversation_id, id, history_from_seq
  FROM conversation_members
 WHERE state = 'active';

-- A seat that joined and then left or was removed: when it stopped being
-- active was never recorded (the leave and remove audit rows carry no seq).
-- Conservative, never more than it was entitled to: it ends at the last
-- message it is known to have been entitled to while active, the highest seq
-- from its boundary on that it was a frozen recipient of (receipts are
-- frozen to active seats only) or that it sent itself; with neither, the
-- activation is empty (to_seq = from_seq - 1) and recovery shows it nothing.
-- A superseded seat's receipts moved to its successor, whose own activation
-- covers them.
INSERT INTO conversation_seat_activity (team_id, conversation_id, member_id, from_seq, to_seq)
SELECT s.team_id, s.conversation_id, s.id, s.history_from_seq,
       greatest(s.history_from_seq - 1,
                (SELECT max(m.seq) FROM message_receipts r
                   JOIN conversation_messages m ON m.team_id = r.team_id AND m.id = r.message_id
                  WHERE r.team_id = s.team_id AND r.member_id = s.id
                    AND m.seq >= s.history_from_seq),
                (SELECT max(m.seq) FROM conversation_messages m
                  WHERE m.team_id = s.team_id AND m.conversation_id = s.conversation_id
                    AND m.sender_member_id = s.id AND m.seq >= s.history_from_seq))
  FROM conversation_members s
 WHERE s.state IN ('left', 'removed') AND s.joined_at IS NOT NULL;
