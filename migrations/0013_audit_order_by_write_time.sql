-- conversation_audit_log orders by `at`. now() is when the transaction
-- began, before it waited for the conversation's lock, so a send that began
-- before a removal but was stored after it sorted before it. Both the
-- conversation's audit rows and its messages are written after that lock is
-- taken: stamped with the clock at the write, the order of `at` is the order
-- the changes took effect in.
ALTER TABLE conversation_audit ALTER COLUMN at SET DEFAULT clock_timestamp();
ALTER TABLE conversation_messages ALTER COLUMN created_at SET DEFAULT clock_timestamp();
