-- Revocations reach every replica's credential cache at once.
--
-- Servers keep the credentials they have looked up for a short while, so an
-- ordinary call costs no credential query (src/auth/cache.rs). Every change
-- that takes a credential away (agent disable, token revoke, revoke/resume/
-- renew of a window) already takes lock_agent_credentials exclusively first
-- (migration 0016); now that also queues a notification on `bus_events`,
-- `[{"k":"credentials","i":<agent>}]`. PostgreSQL delivers it at that
-- transaction's commit (never if it rolls back) to every listening server,
-- whichever process committed it (a replica, the CLI), and each server then
-- drops what it cached. Writes do not depend on this: each still re-reads its
-- credential in its own transaction (agent_write_refusal).
CREATE OR REPLACE FUNCTION lock_agent_credentials(p_agent uuid, p_exclusive boolean)
RETURNS void LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF p_exclusive THEN
        PERFORM pg_advisory_xact_lock(1094931297, hashtext(p_agent::text));
        PERFORM pg_notify('bus_events', json_build_array(
            json_build_object('k', 'credentials', 'i', p_agent::text))::text);
    ELSE
        PERFORM pg_advisory_xact_lock_shared(1094931297, hashtext(p_agent::text));
    END IF;
END
$$;
