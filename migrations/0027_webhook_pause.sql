-- Pausing a webhook (`webhook pause|resume`, `POST /admin/teams/{team}/
-- webhooks/{id}/pause|resume`): a receiver down for maintenance, or one that
-- misbehaves, is silenced without losing the hook's settings and secret.
--
-- While a hook is paused, events are not queued for it (a pause may last
-- days, and a backlog of that size is not what anyone resuming expects; this
-- is how GitHub's inactive hooks and Stripe's disabled endpoints behave), and
-- the deliveries queued before the pause wait: the dispatcher claims none of
-- them (src/store/webhooks/delivery.rs locks the hook row FOR SHARE SKIP
-- LOCKED while it claims, so no claim leases one once a pause has answered)
-- and they go out, oldest first, on resume. A delivery already being sent
-- when the pause commits completes.

ALTER TABLE webhooks
    ADD COLUMN paused_at timestamptz,
    ADD COLUMN paused_by text,
    ADD CHECK ((paused_at IS NULL) = (paused_by IS NULL));

CREATE OR REPLACE FUNCTION webhook_enqueue(p_team uuid, p_family text, p_event text,
                                           p_channel text, p_data jsonb)
RETURNS void LANGUAGE sql VOLATILE AS $$
    INSERT INTO webhook_deliveries (team_id, webhook_id, event, payload)
    SELECT w.team_id, w.id, p_event, p_data
    FROM webhooks w
    WHERE w.team_id = p_team
      AND w.paused_at IS NULL
      AND p_family = ANY (w.events)
      AND (p_channel IS NULL OR w.channels IS NULL OR p_channel = ANY (w.channels))
$$;
