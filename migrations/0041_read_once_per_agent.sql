-- Issue 36, item 5: a message read once.
--
-- A direct message to the bare agent name is read once per agent: when any
-- window of the agent has read it, no window of the agent (one opened later
-- included) counts it as unread or gets it again from `only_new`. Messages
-- addressed to one window stay that window's (its own cursors, as before).
--
-- `agent_read_cursors`: one position per agent, beside its windows'
-- `read_cursors`. Every direct message to the agent as a whole at or below
-- it has been handed out as new to some window of the agent. A window's
-- read moves it (a compare and set on the position the read saw, in the
-- read's own statement) only when its page holds such a message, so a read
-- of channels alone never touches it.
CREATE TABLE agent_read_cursors (
    team_id       uuid        NOT NULL,
    agent_id      uuid        NOT NULL,
    last_position bigint      NOT NULL,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (team_id, agent_id),
    FOREIGN KEY (team_id, agent_id) REFERENCES agents (team_id, id)
);

-- What the windows have read already counts for the agent: every window's
-- cursor covers every message to the agent below it (a cursor starts at 0
-- and moves only past what a read handed out).
INSERT INTO agent_read_cursors (team_id, agent_id, last_position)
SELECT team_id, agent_id, max(last_position) FROM read_cursors
WHERE scope IN ('inbox', 'all')
GROUP BY team_id, agent_id
HAVING max(last_position) > 0;

-- Direct messages read one by one, outside the cursors: the answer an
-- `ask_agent` call returned to its asker. Read for its recipient (the
-- asking window, or the agent as a whole), so it is neither unread nor new
-- again. Reads look its key up for each direct message past their cursor.
CREATE TABLE message_reads (
    team_id    uuid        NOT NULL,
    message_id uuid        NOT NULL,
    read_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (team_id, message_id),
    FOREIGN KEY (team_id, message_id) REFERENCES messages (team_id, id) ON DELETE CASCADE
);

-- A read whose page moved the agent's cursor while another read of the same
-- window and scope moved the window's: the statement is undone whole (this
-- error) and the read runs again, so nothing is handed out twice or passed
-- over unread.
CREATE FUNCTION read_cursor_raced() RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    RAISE EXCEPTION 'a concurrent read of the same window moved its cursor; read again'
        USING ERRCODE = 'AC041';
END
$$;
