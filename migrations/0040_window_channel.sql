-- One default channel per window (issue 36, item 3).
--
-- A window's default channel was decided in two places: the stdio proxy
-- kept the channel `.acs.toml` or `configure_session` named to itself, while
-- the bus decided from the heartbeat's `project` label or the window label.
-- The channel set for a window now travels in the heartbeat and is kept with
-- the window's other labels, so the bus alone decides (store/messaging/
-- messages: `default_channel_of`): the channel set for the window, else the
-- project label's, else the window label's.
--
-- presence.channel: the channel set for this window, already a valid channel
-- name (Rust checks it before the call); NULL when none is set.
ALTER TABLE presence ADD COLUMN channel text;

-- store_heartbeat (migration 0033) with the channel as one more optional
-- field: (given, value) as the others, not given keeps the stored value,
-- given with NULL clears it. The answer carries it.
DROP FUNCTION store_heartbeat(uuid, uuid, uuid, uuid, bigint, text, text,
                              boolean, text, boolean, text, boolean, text,
                              boolean, text, boolean, text, integer, integer);

CREATE FUNCTION store_heartbeat(
    p_team uuid, p_agent uuid, p_token uuid, p_window uuid, p_epoch bigint,
    p_session text, p_status text,
    p_repo_given boolean, p_repo text,
    p_branch_given boolean, p_branch text,
    p_activity_given boolean, p_activity text,
    p_project_given boolean, p_project text,
    p_role_given boolean, p_role text,
    p_channel_given boolean, p_channel text,
    p_ttl integer, p_default_ttl integer)
RETURNS TABLE (refusal text, session_epoch bigint, refused_since timestamptz,
               outcome text, detail jsonb)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
BEGIN
    SELECT r.refusal, r.session_epoch, r.refused_since
      INTO refusal, session_epoch, refused_since
      FROM agent_write_refusal(p_team, p_agent, p_token, p_window, p_epoch, false) r;
    IF refusal IS NOT NULL THEN
        RETURN NEXT;
        RETURN;
    END IF;

    -- One statement writes the row, so concurrent beats of one window never
    -- interleave field by field.
    WITH beat AS (
        INSERT INTO presence AS p (team_id, agent_id, session, status, repo, branch, activity,
                                   project, role, channel, ttl_seconds, expires_at)
        VALUES (p_team, p_agent, p_session, coalesce(p_status, 'active'), p_repo, p_branch,
                p_activity, p_project, p_role, p_channel, coalesce(p_ttl, p_default_ttl),
                now() + make_interval(secs => coalesce(p_ttl, p_default_ttl)))
        ON CONFLICT (team_id, agent_id, session) DO UPDATE SET
            status = coalesce(p_status, p.status),
            repo = CASE WHEN p_repo_given THEN EXCLUDED.repo ELSE p.repo END,
            branch = CASE WHEN p_branch_given THEN EXCLUDED.branch ELSE p.branch END,
            activity = CASE WHEN p_activity_given THEN EXCLUDED.activity ELSE p.activity END,
            project = CASE WHEN p_project_given THEN EXCLUDED.project ELSE p.project END,
            role = CASE WHEN p_role_given THEN EXCLUDED.role ELSE p.role END,
            channel = CASE WHEN p_channel_given THEN EXCLUDED.channel ELSE p.channel END,
            ttl_seconds = coalesce(p_ttl, p.ttl_seconds),
            last_seen_at = now(),
            expires_at = now() + make_interval(secs => coalesce(p_ttl, p.ttl_seconds))
        RETURNING p.*)
    SELECT jsonb_build_object(
               'session', p.session,
               'address', CASE WHEN p.session = '' THEN a.name ELSE a.name || '/' || p.session END,
               'online', p.expires_at > now() AND a.disabled_at IS NULL,
               'status', p.status, 'repo', p.repo, 'branch', p.branch,
               'activity', p.activity, 'project', p.project, 'role', p.role,
               'channel', p.channel,
               'ttl_seconds', p.ttl_seconds, 'last_seen_at', p.last_seen_at,
               'expires_at', p.expires_at)
      INTO detail
      FROM beat p JOIN agents a ON a.team_id = p.team_id AND a.id = p.agent_id;
    outcome := 'beat';
    RETURN NEXT;
END
$$;
