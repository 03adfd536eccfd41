-- Issue 38, item 1: a person on the dashboard. A person is a row of
-- `agents` whose `kind` is 'person': the same name namespace, so a direct
-- message or an `ask_agent` to the name reaches the person with no new
-- addressing. A person's credential is an agent token (`agent_tokens`) that
-- `/mcp` refuses: a person signs in to the dashboard only, and so never holds
-- a claim, a lease, a lock or a reservation. The dashboard's sign-ins gain
-- the principal 'person'.
ALTER TABLE agents
    ADD COLUMN kind text NOT NULL DEFAULT 'agent' CHECK (kind IN ('agent', 'person'));

ALTER TABLE dashboard_sessions DROP CONSTRAINT dashboard_sessions_principal_check;
ALTER TABLE dashboard_sessions
    ADD CONSTRAINT dashboard_sessions_principal_check
    CHECK (principal IN ('agent', 'admin', 'person'));
