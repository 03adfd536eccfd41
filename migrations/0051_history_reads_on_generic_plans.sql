-- Issue 34 item 7: `conversation_inbox_status` and `team_digest` cost the
-- same against a large history as against a small one.
--
-- Their statements were already bounded by their page (issue 19, issue 34);
-- what still grew with the history was planning. Sent from Rust as prepared
-- statements, they were planned again for every call once the team's
-- history was large: PostgreSQL's plan cache keeps a custom plan when the
-- generic one is estimated dearer, and with one team holding most of the
-- rows every generic estimate is (the history benchmark: the status's count
-- planned in 0.6 ms per call on the large team and not at all on the small
-- one; the digest's channel, task and note reads 0.4, 0.2 and 0.1 ms). The
-- generic plans are the same bounded walks (the same buffers or fewer, on
-- both histories). So these statements move here unchanged, into functions
-- that always run their generic plan, as the fenced functions do.

-- `conversation_inbox_status`: the borrowed-label refusal (p_bare_label: a
-- bare agent token wearing a window label) and the counts of
-- store/conversations/inbox/owed.rs, in one call. `borrowed` true: nothing
-- is counted.
CREATE FUNCTION inbox_owed_counts(
    p_team uuid, p_agent uuid, p_session text, p_bare_label boolean, p_key text,
    p_handout_secs double precision, p_cap bigint)
RETURNS TABLE (borrowed boolean, queued bigint, handed_out bigint, unqueued bigint,
               at_least boolean)
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
BEGIN
    IF p_bare_label AND window_label_registered(p_team, p_agent, p_session) THEN
        RETURN QUERY SELECT true, 0::bigint, 0::bigint, 0::bigint, false;
        RETURN;
    END IF;
    -- Receipts not yet referenced are counted only while the references
    -- are under the cap: for a seat with a top-up mark, the owed receipts
    -- of the messages after it; for one without, among at most p_cap of
    -- its undelivered receipts.
    RETURN QUERY
    WITH seats AS (
         SELECT w.id, w.conversation_id, k.through_seq
           FROM conversation_members w
           LEFT JOIN inbox_topup_marks k
                  ON k.team_id = w.team_id AND k.member_id = w.id AND k.recipient_key = p_key
          WHERE w.team_id = p_team AND w.agent_id = p_agent AND w.session = p_session),
     examined AS (
         SELECT s.id AS member_id, x.message_id
           FROM seats s
           CROSS JOIN LATERAL (
               (SELECT m.id AS message_id
                  FROM conversation_messages m
                 WHERE s.through_seq IS NOT NULL
                   AND m.team_id = p_team AND m.conversation_id = s.conversation_id
                   AND m.seq > s.through_seq
                 ORDER BY m.seq LIMIT p_cap)
               UNION ALL
               (SELECT r.message_id FROM message_receipts r
                 WHERE s.through_seq IS NULL
                   AND r.team_id = p_team AND r.member_id = s.id AND r.delivered_at IS NULL
                 ORDER BY r.member_id, r.message_id LIMIT p_cap)) x),
     unqueued AS (
         SELECT 1 FROM examined e
           JOIN message_receipts r
             ON r.team_id = p_team AND r.message_id = e.message_id AND r.member_id = e.member_id
           JOIN conversation_messages m ON m.team_id = p_team AND m.id = e.message_id
          WHERE r.delivered_at IS NULL AND m.publication_state = 'stored'
            AND (SELECT true FROM inbox_references i
                  WHERE i.team_id = p_team AND i.recipient_key = p_key
                    AND i.kind = 'message' AND i.message_id = e.message_id LIMIT 1) IS NULL),
     queued AS (
         SELECT count(*) AS n FROM (
             SELECT 1 FROM inbox_references
              WHERE team_id = p_team AND recipient_key = p_key AND delivered_at IS NULL
              LIMIT p_cap) q),
     handed_out AS (
         SELECT count(*) AS n FROM (
             SELECT 1 FROM inbox_references
              WHERE team_id = p_team AND recipient_key = p_key AND delivered_at IS NULL
                AND handed_out_at >= now() - make_interval(secs => p_handout_secs)
              LIMIT p_cap) h)
    SELECT false,
           q.n,
           (SELECT n FROM handed_out),
           CASE WHEN q.n >= p_cap THEN 0 ELSE (SELECT count(*) FROM unqueued) END,
           q.n >= p_cap
           OR EXISTS (SELECT 1 FROM examined GROUP BY member_id HAVING count(*) >= p_cap)
      FROM queued q;
END
$$;

-- `team_digest`'s channel activity (store/messaging/overview.rs): the
-- channels whose newest message is in the period, each counted among its
-- newest p_count messages, and their latest p_latest each, of which only the
-- newest p_shown in all are shown. A channel past them keeps its row(s)
-- with the message's columns NULL: it is listed with its count and no
-- message. The cap in all is new (issue 34 item 7): with every channel
-- active, the latest p_latest of each made the answer, not the reads, grow
-- with the history (3 a channel on the benchmark's large team, 1 on the
-- small one). Messages and senders are read for the shown rows only.
CREATE FUNCTION digest_channel_activity(
    p_team uuid, p_since timestamptz, p_all boolean, p_focus uuid, p_preview integer,
    p_latest bigint, p_count bigint, p_shown bigint)
RETURNS TABLE (channel text, total bigint, id uuid, preview text, announce boolean,
               created_at timestamptz, from_person boolean, "from" text)
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH active AS (
        SELECT c.name, latest.position, latest.total
          FROM channels c
         CROSS JOIN LATERAL (
             SELECT newest.position, count(*) OVER () AS total,
                    row_number() OVER (ORDER BY newest.position DESC) AS rn
               FROM (SELECT w.position, w.created_at, w.announce FROM messages w
                      WHERE w.team_id = c.team_id AND w.channel_id = c.id
                      ORDER BY w.position DESC LIMIT p_count) newest
              WHERE newest.created_at > p_since
                AND (p_all OR c.id = p_focus OR newest.announce)) latest
         WHERE c.team_id = p_team AND latest.rn <= p_latest
           AND (SELECT n.created_at FROM messages n
                 WHERE n.team_id = c.team_id AND n.channel_id = c.id
                 ORDER BY n.position DESC LIMIT 1) > p_since),
    shown AS (
        SELECT a.position FROM active a ORDER BY a.position DESC LIMIT p_shown)
    SELECT a.name, a.total, m.id, left(m.body, p_preview), m.announce, m.created_at,
           s.kind = 'person',
           CASE WHEN m.sender_session = '' THEN s.name ELSE s.name || '/' || m.sender_session END
      FROM active a
      LEFT JOIN (shown h
                 JOIN messages m ON m.team_id = p_team AND m.position = h.position
                 JOIN agents s ON s.team_id = m.team_id AND s.id = m.sender_id)
             ON h.position = a.position
     ORDER BY a.name, a.position;
END
$$;

-- `team_digest`'s task moves: the team's newest p_limit task moves, walked
-- on their update-time index, then each task's latest event in the period.
CREATE FUNCTION digest_task_moves(p_team uuid, p_since timestamptz, p_limit bigint)
RETURNS TABLE (key text, title text, status text, last_event text, at timestamptz, by text)
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    -- The task columns are domains over text (migration 0050): RETURN QUERY
    -- wants the declared types exactly.
    SELECT t.key::text, t.title::text,
           (CASE WHEN t.status = 'claimed' AND t.lease_expires_at <= now() THEN 'open'
                 ELSE t.status END)::text,
           e.kind::text, e.at,
           CASE WHEN e.session = '' THEN a.name ELSE a.name || '/' || e.session END
      FROM (SELECT id, team_id, key, title, status, lease_expires_at FROM tasks
             WHERE team_id = p_team AND updated_at > p_since
             ORDER BY updated_at DESC LIMIT p_limit) t
     CROSS JOIN LATERAL (
         SELECT kind, at, session, agent_id FROM task_events
          WHERE team_id = t.team_id AND task_id = t.id AND at > p_since
          ORDER BY at DESC, id DESC LIMIT 1) e
      JOIN agents a ON a.team_id = t.team_id AND a.id = e.agent_id
     ORDER BY e.at DESC;
END
$$;

-- `team_digest`'s notes changed in the period, newest first.
CREATE FUNCTION digest_note_changes(p_team uuid, p_since timestamptz, p_limit bigint)
RETURNS TABLE (scope text, key text, revision bigint, deleted boolean, at timestamptz, by text)
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT n.scope, n.key, n.revision, n.deleted_at IS NOT NULL, n.updated_at,
           CASE WHEN n.updated_by_session = '' THEN a.name ELSE a.name || '/' || n.updated_by_session END
      FROM notes n JOIN agents a ON a.team_id = n.team_id AND a.id = n.updated_by_agent_id
     WHERE n.team_id = p_team AND n.updated_at > p_since
     ORDER BY n.updated_at DESC LIMIT p_limit;
END
$$;
