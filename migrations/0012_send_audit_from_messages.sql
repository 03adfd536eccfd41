-- A send's audit entry is its message row.
--
-- A conversation message is never deleted, and the columns that say who
-- sent it, from which window, when, under which request_id, how large, and
-- to how many recipients (its receipt rows) never change. The send path also
-- wrote all of that again as a conversation_audit row: a fifth of the WAL a
-- send writes, and WAL bounds how many sends commit per second. The log of
-- changes to conversations is now this view: every conversation_audit row,
-- and one 'send' entry per message, with the detail the audit row carried
-- (never a body).
CREATE VIEW conversation_audit_log AS
SELECT a.team_id, a.conversation_id, a.at, a.actor_id, a.actor_session, a.action,
       a.subject, a.detail
  FROM conversation_audit a
UNION ALL
SELECT m.team_id, m.conversation_id, m.created_at, m.sender_id, m.sender_session, 'send',
       m.id::text,
       jsonb_build_object('message_id', m.id, 'seq', m.seq, 'request_id', m.request_id,
                          'body_bytes', m.body_bytes,
                          'recipients', (SELECT count(*) FROM message_receipts r
                                          WHERE r.team_id = m.team_id AND r.message_id = m.id))
  FROM conversation_messages m;

-- The rows sends wrote before this migration say what the view says now.
DELETE FROM conversation_audit WHERE action = 'send';
