-- Issue 34: `fetch_conversation_inbox`'s PostgreSQL part in one round trip.
--
-- Before, a fetch was BEGIN, the write fence, the top-up walk, the hand-out
-- page, the hand-out mark and COMMIT (six round trips), after a separate
-- borrowed-label read. `fetch_inbox_page` runs them in that order in one
-- call, with the shape of the other fenced functions (migration 0033):
-- the fence's refusal, or outcome `borrowed`, or outcome `fetched` with
-- detail {"deliveries": [...], "more": bool}. The broker's consumer (a team
-- routed to JetStream) is still asked before, in Rust: a broker is not
-- something PostgreSQL can call. The statements are the ones
-- store/inbox/owed.rs ran, moved here unchanged; their comments say why
-- each is bounded by its page (issue 19).
CREATE FUNCTION fetch_inbox_page(
    p_team uuid, p_agent uuid, p_token uuid, p_window uuid, p_epoch bigint,
    p_session text, p_bare_label boolean, p_key text, p_limit bigint,
    p_step bigint, p_handout_secs double precision)
RETURNS TABLE (refusal text, session_epoch bigint, refused_since timestamptz,
               outcome text, detail jsonb)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_walked_full boolean;
    v_over        boolean;
    v_deliveries  jsonb;
    v_handed      uuid[];
BEGIN
    SELECT r.refusal, r.session_epoch, r.refused_since
      INTO refusal, session_epoch, refused_since
      FROM agent_write_refusal(p_team, p_agent, p_token, p_window, p_epoch, false) r;
    IF refusal IS NOT NULL THEN
        RETURN NEXT;
        RETURN;
    END IF;
    IF p_bare_label AND window_label_registered(p_team, p_agent, p_session) THEN
        outcome := 'borrowed';
        RETURN NEXT;
        RETURN;
    END IF;

    -- The top-up: queue a reference for each owed receipt of the next
    -- p_step messages of every seat this window holds, and move the seats'
    -- marks (inbox_topup_marks, migration 0022). A seat without a mark
    -- starts just before its oldest undelivered receipt. Messages still
    -- pending publication are walked past: their references are queued when
    -- they are confirmed (the outbox's settle).
    WITH seats AS (
        SELECT w.id, w.conversation_id, k.through_seq AS marked,
               COALESCE(k.through_seq,
                        -- One probe per undelivered receipt (a scalar
                        -- subquery, never a scan of the messages).
                        (SELECT min((SELECT m.seq FROM conversation_messages m
                                      WHERE m.team_id = r.team_id
                                        AND m.id = r.message_id)) - 1
                           FROM message_receipts r
                          WHERE r.team_id = w.team_id AND r.member_id = w.id
                            AND r.delivered_at IS NULL),
                        c.last_seq) AS after_seq
          FROM conversation_members w
          JOIN conversations c ON c.team_id = w.team_id AND c.id = w.conversation_id
          LEFT JOIN inbox_topup_marks k
                 ON k.team_id = w.team_id AND k.member_id = w.id AND k.recipient_key = p_key
         WHERE w.team_id = p_team AND w.agent_id = p_agent AND w.session = p_session),
    walked AS (
        SELECT s.id AS member_id, m.*
          FROM seats s
          CROSS JOIN LATERAL (
              SELECT m.id, m.seq, m.conversation_id, m.created_at, m.publication_state,
                     m.sender_id, m.sender_session
                FROM conversation_messages m
               WHERE m.team_id = p_team AND m.conversation_id = s.conversation_id
                 AND m.seq > s.after_seq
               ORDER BY m.seq LIMIT p_step) m),
    queued AS (
        INSERT INTO inbox_references
            (id, team_id, recipient_key, recipient_id, recipient_session, kind,
             conversation_id, message_id, seq, actor, created_at)
        SELECT gen_random_uuid(), p_team, p_key, p_agent, p_session, 'message',
               m.conversation_id, m.id, m.seq,
               CASE WHEN m.sender_session = '' THEN a.name
                    ELSE a.name || '/' || m.sender_session END,
               -- Owed since the send committed (the synchronous path's confirmation).
               m.created_at
          FROM walked m
          JOIN message_receipts r
            ON r.team_id = p_team AND r.message_id = m.id AND r.member_id = m.member_id
          JOIN agents a ON a.team_id = p_team AND a.id = m.sender_id
         WHERE r.delivered_at IS NULL AND m.publication_state = 'stored'
           -- Per row (a scalar subquery): one probe of the unique index.
           AND (SELECT true FROM inbox_references i
                 WHERE i.team_id = p_team AND i.recipient_key = p_key
                   AND i.kind = 'message' AND i.message_id = m.id LIMIT 1) IS NULL
        ON CONFLICT DO NOTHING),
    marked AS (
        INSERT INTO inbox_topup_marks (team_id, member_id, recipient_key, through_seq)
        SELECT p_team, s.id, p_key,
               COALESCE((SELECT max(w.seq) FROM walked w WHERE w.member_id = s.id),
                        s.after_seq, 0)
          FROM seats s
         -- A mark is written only when it moves: an idle fetch writes nothing.
         WHERE s.marked IS NULL OR EXISTS (SELECT 1 FROM walked w WHERE w.member_id = s.id)
        ON CONFLICT (team_id, member_id, recipient_key)
        DO UPDATE SET through_seq = EXCLUDED.through_seq
                WHERE inbox_topup_marks.through_seq < EXCLUDED.through_seq)
    SELECT EXISTS (SELECT 1 FROM walked GROUP BY member_id HAVING count(*) >= p_step)
      INTO v_walked_full;

    -- The hand-out page: the next p_limit + 1 references owed, locked, in
    -- seq order within each conversation, conversations by their oldest owed
    -- reference; none handed out in the last p_handout_secs. Conversations
    -- holding owed references are found by a skip scan (one index probe
    -- each); each gives its oldest owed reference and its first page, from
    -- inbox_references_owed_first and _owed_order (migration 0022). Each
    -- ORDER BY leads with the conversation so that only those indexes serve
    -- it. A row another fetch of this window holds is skipped, so two
    -- concurrent fetches never hand out the same reference.
    WITH RECURSIVE conversations AS (
        (SELECT conversation_id FROM inbox_references
          WHERE team_id = p_team AND recipient_key = p_key AND delivered_at IS NULL
          ORDER BY conversation_id LIMIT 1)
        UNION ALL
        SELECT (SELECT i.conversation_id FROM inbox_references i
                 WHERE i.team_id = p_team AND i.recipient_key = p_key AND i.delivered_at IS NULL
                   AND i.conversation_id > c.conversation_id
                 ORDER BY i.conversation_id LIMIT 1)
          FROM conversations c WHERE c.conversation_id IS NOT NULL),
    owed AS (
        SELECT first.at AS conversation_first, page.id
          FROM conversations c
          CROSS JOIN LATERAL (
              SELECT i.created_at AS at FROM inbox_references i
               WHERE i.team_id = p_team AND i.recipient_key = p_key AND i.delivered_at IS NULL
                 AND i.conversation_id = c.conversation_id
                 AND (i.handed_out_at IS NULL
                      OR i.handed_out_at < now() - make_interval(secs => p_handout_secs))
               ORDER BY i.conversation_id, i.created_at LIMIT 1) first
          CROSS JOIN LATERAL (
              SELECT i.id FROM inbox_references i
               WHERE i.team_id = p_team AND i.recipient_key = p_key AND i.delivered_at IS NULL
                 AND i.conversation_id = c.conversation_id
                 AND (i.handed_out_at IS NULL
                      OR i.handed_out_at < now() - make_interval(secs => p_handout_secs))
               ORDER BY i.conversation_id, i.seq, i.kind, i.id LIMIT p_limit + 1) page
         WHERE c.conversation_id IS NOT NULL),
    locked AS (
        SELECT i.id, i.kind, i.conversation_id, i.message_id, i.seq, i.actor,
               i.receipt, i.created_at, o.conversation_first
          FROM inbox_references i JOIN owed o ON o.id = i.id
         ORDER BY o.conversation_first, i.conversation_id, i.seq, i.kind, i.id
         LIMIT p_limit + 1
           FOR UPDATE OF i SKIP LOCKED),
    numbered AS (
        SELECT l.*, row_number() OVER (ORDER BY l.conversation_first, l.conversation_id,
                                                l.seq, l.kind, l.id) AS n
          FROM locked l)
    SELECT count(*) > p_limit,
           coalesce(jsonb_agg(jsonb_build_object(
                        'delivery_id', n.id, 'kind', n.kind,
                        'conversation_id', n.conversation_id, 'message_id', n.message_id,
                        'seq', n.seq, 'from', n.actor, 'receipt', NULLIF(n.receipt, ''),
                        'queued_at', n.created_at) ORDER BY n.n)
                    FILTER (WHERE n.n <= p_limit), '[]'::jsonb),
           coalesce(array_agg(n.id) FILTER (WHERE n.n <= p_limit), '{}')
      INTO v_over, v_deliveries, v_handed
      FROM numbered n;

    UPDATE inbox_references SET handed_out_at = now() WHERE id = ANY(v_handed);

    outcome := 'fetched';
    -- A walk that stopped at its step may have left receipts owed.
    detail := jsonb_build_object('deliveries', v_deliveries,
                                 'more', v_over OR v_walked_full);
    RETURN NEXT;
END
$$;
