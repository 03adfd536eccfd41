-- Names are Unicode NFC from this version on (src/store/text.rs): a tool's
-- note key, tag or task key is normalised before it is stored, and before it
-- is looked up. A name stored earlier in another form (an `e` followed by a
-- combining accent, as some keyboards and macOS paths produce) would no
-- longer be found by its key, so it is brought to NFC here.
--
-- A name whose NFC form is already taken (the composed and decomposed
-- spellings were saved as two notes or two tasks before the rule) stays as
-- it was: it is still listed, with its own history, and nothing is merged or
-- lost. The same holds when NFC would make it longer than its column allows.
--
-- normalize() needs a UTF8 database; on any other encoding nothing changes.
-- Channel, project, agent, window and scope names are ASCII: nothing to do.
DO $$
BEGIN
    IF current_setting('server_encoding') <> 'UTF8' THEN
        RETURN;
    END IF;

    -- One row per target name (the oldest), and only when no row has it yet.
    WITH renamed AS (
        SELECT id, normalize(key, NFC) AS nfc,
               row_number() OVER (PARTITION BY team_id, scope, normalize(key, NFC)
                                  ORDER BY created_at, id) AS nth
        FROM notes
        WHERE key IS NOT NFC NORMALIZED
    )
    UPDATE notes n SET key = r.nfc
    FROM renamed r
    WHERE n.id = r.id AND r.nth = 1 AND octet_length(r.nfc) <= 256
      AND NOT EXISTS (SELECT 1 FROM notes o
                      WHERE o.team_id = n.team_id AND o.scope = n.scope AND o.key = r.nfc);

    WITH renamed AS (
        SELECT id, normalize(key, NFC) AS nfc,
               row_number() OVER (PARTITION BY team_id, normalize(key, NFC)
                                  ORDER BY created_at, seq) AS nth
        FROM tasks
        WHERE key IS NOT NFC NORMALIZED
    )
    UPDATE tasks t SET key = r.nfc
    FROM renamed r
    WHERE t.id = r.id AND r.nth = 1 AND octet_length(r.nfc) <= 128
      AND NOT EXISTS (SELECT 1 FROM tasks o WHERE o.team_id = t.team_id AND o.key = r.nfc);

    -- Tags are a sorted set (byte order, as the server sorts them): two
    -- spellings of one tag become one.
    UPDATE notes SET tags = ARRAY(
        SELECT tag FROM (SELECT DISTINCT normalize(t, NFC) COLLATE "C" AS tag
                         FROM unnest(tags) t) nfc
        ORDER BY tag)
    WHERE EXISTS (SELECT 1 FROM unnest(tags) t WHERE t IS NOT NFC NORMALIZED);
END
$$;
