-- team_digest lists the notes changed in its period, deleted ones included
-- (issue 34, item 7). The partial index notes_team_updated (migration 0005)
-- holds live notes only, so that read scanned and sorted every note of the
-- team: its cost grew with the team's history. This index walks the newest
-- changes first and stops at the page.
CREATE INDEX notes_team_changed ON notes (team_id, updated_at DESC);
