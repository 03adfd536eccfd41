-- A tsvector holds at most 1 MiB, and a body of many distinct short tokens
-- (ids, hashes) grows past that when indexed: such a body was accepted by the
-- 1 MiB body limit and then refused by the INSERT. Index the first 100 000
-- characters, as notes do.
DROP INDEX messages_search;
ALTER TABLE messages DROP COLUMN search;
ALTER TABLE messages
    ADD COLUMN search tsvector GENERATED ALWAYS AS (to_tsvector('simple', left(body, 100000))) STORED;
CREATE INDEX messages_search ON messages USING gin (search);
