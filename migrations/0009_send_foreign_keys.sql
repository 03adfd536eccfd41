-- Fewer foreign-key checks per conversation send, no weaker guarantees.
--
-- A send inserts one message, a receipt per recipient and an audit row, and
-- each foreign key costs a lookup that also locks the referenced row: ~15 per
-- send, several on rows every concurrent sender shares (the agent's, the
-- team's). Each folded or dropped key below is implied by one that stays:
--
-- - A message's seat now names its agent too: (team, conversation, seat,
--   sender) must be a seat of that conversation held by that agent. That
--   implies the conversation (a seat references it) and the sender agent,
--   so those two keys go.
-- - A receipt's seat likewise names its recipient: (team, seat, recipient)
--   must be that seat, held by that agent.
-- - An audit row's team is implied by its actor: (team, actor) references
--   agents (team, id), and an agent references its team.

ALTER TABLE conversation_members
    ADD CONSTRAINT conversation_members_seat_agent UNIQUE (team_id, conversation_id, id, agent_id),
    ADD CONSTRAINT conversation_members_id_agent UNIQUE (team_id, id, agent_id);

ALTER TABLE conversation_messages
    DROP CONSTRAINT conversation_messages_team_id_conversation_id_fkey,
    DROP CONSTRAINT conversation_messages_team_id_conversation_id_sender_membe_fkey,
    DROP CONSTRAINT conversation_messages_team_id_sender_id_fkey,
    ADD CONSTRAINT conversation_messages_sender_seat_fkey
        FOREIGN KEY (team_id, conversation_id, sender_member_id, sender_id)
        REFERENCES conversation_members (team_id, conversation_id, id, agent_id);

ALTER TABLE message_receipts
    DROP CONSTRAINT message_receipts_team_id_member_id_fkey,
    DROP CONSTRAINT message_receipts_team_id_recipient_id_fkey,
    ADD CONSTRAINT message_receipts_recipient_seat_fkey
        FOREIGN KEY (team_id, member_id, recipient_id)
        REFERENCES conversation_members (team_id, id, agent_id);

ALTER TABLE conversation_audit
    DROP CONSTRAINT conversation_audit_team_id_fkey;
