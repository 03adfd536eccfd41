-- Webhook deliveries (issue 33, items 1 and 6).
--
-- `team prune` now removes settled deliveries (delivered or failed) older
-- than its cut-off, and `team usage` counts every delivery against the
-- team: a delivery's payload carries what its event said (a channel post's
-- body), and failed ones used to stay until their hook was removed. Both
-- find a team's rows by age, hence this index.
CREATE INDEX webhook_deliveries_team_age ON webhook_deliveries (team_id, created_at);

-- What older builds recorded in a failed delivery's error, and which a
-- listing showed to whoever manages the team's hooks: the first 200
-- characters of the receiver's body after its status ("the receiver
-- answered 404 Not Found: <body>"), and the hook's URL in reqwest's text
-- ("error sending request for url (<URL>)"), whose path or query may carry
-- the receiver's secret. Kept: the status and its phrase, and the cause.
UPDATE webhook_deliveries
   SET last_error = substring(last_error FROM '^the receiver answered [^:]*')
 WHERE last_error LIKE 'the receiver answered %';

UPDATE webhook_deliveries d
   SET last_error = regexp_replace(replace(d.last_error, w.url, '<the hook''s URL>'),
                                   ' for url \([^)]*\)', '', 'g')
  FROM webhooks w
 WHERE w.id = d.webhook_id
   AND (strpos(d.last_error, w.url) > 0 OR d.last_error LIKE '% for url (%');

-- A credential confined to a team could set allow_private (item 1); only the
-- local operator or a global admin credential may now. A hook that such a
-- credential added (its `created_by` names the credential, `admin:<prefix>`)
-- loses the flag: its next delivery to a non-public address is refused and
-- says so in `webhook list`, and the operator or a global admin adds it
-- again if the receiver really is on the server's network. A prefix that a
-- global credential also has is left alone.
UPDATE webhooks w
   SET allow_private = false
 WHERE w.allow_private
   AND EXISTS (SELECT 1 FROM admin_credentials c
                WHERE 'admin:' || c.display_prefix = w.created_by AND c.team_id IS NOT NULL)
   AND NOT EXISTS (SELECT 1 FROM admin_credentials c
                    WHERE 'admin:' || c.display_prefix = w.created_by AND c.team_id IS NULL);
