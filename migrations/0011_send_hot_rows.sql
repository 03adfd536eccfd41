-- Fewer row locks per send and per settled message.
--
-- Each foreign-key check share-locks the row it finds (FOR KEY SHARE), and a
-- row lock is a write: the row's lock word is rewritten under an exclusive
-- lock on its page and logged to the WAL. Measured on the send path, the
-- WAL a send writes, not CPU, bounds how many sends commit per second, and
-- some of these locks land on a row every concurrent writer shares.
--
-- - The send's audit row named its actor through (team_id, actor_id) ->
--   agents, and a settled message's inbox references their recipient the
--   same way: every send by an agent, and every reference to it, locked that
--   agent's one row. With several windows of one agent at work, each lock
--   rewrote the row's lock word (a multixact of all current lockers) and the
--   writers queued on its page. The bus writes the authenticated agent (or
--   the seat's agent) into these rows in the same transaction, and agents are
--   never deleted (they are disabled), so the keys guard nothing the bus does
--   not already ensure.
-- - A message's seat (0009) and a receipt's seat are read by the very
--   statement that writes them, under the conversation's lock, from
--   conversation_members rows that are never deleted or re-keyed: the keys
--   cost a lock per message and per receipt and can never fail. The unique
--   constraints 0009 added only for them go too.
ALTER TABLE conversation_audit
    DROP CONSTRAINT conversation_audit_team_id_actor_id_fkey;
ALTER TABLE inbox_references
    DROP CONSTRAINT inbox_references_team_id_recipient_id_fkey;
ALTER TABLE conversation_messages
    DROP CONSTRAINT conversation_messages_sender_seat_fkey;
ALTER TABLE message_receipts
    DROP CONSTRAINT message_receipts_recipient_seat_fkey;
ALTER TABLE conversation_members
    DROP CONSTRAINT conversation_members_seat_agent,
    DROP CONSTRAINT conversation_members_id_agent;
