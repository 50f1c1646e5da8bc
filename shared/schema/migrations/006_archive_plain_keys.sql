-- Where the archived rows of keys without a timestamp are.
--
-- A ULID or UUIDv7 key bounds the months its archive rows can lie in (see
-- package keytime), so its lookup reads only those partitions. Any other key
-- could lie in every month ever archived: with ten years of monthly
-- partitions a lookup would read 120 of them. This table maps a hash of each
-- such key to the expiry of each of its archive rows, so that a lookup reads
-- one small index here and then only the partitions those expiries fall in.
-- A key absent from here (and from every range still pending, below) is not
-- in the archive.
--
-- The invariant: every archive row whose key has no timestamp has a row here,
-- or lies in a range of idempotency_archive_plain_keys_pending. It holds
-- because
--   - every row enters the archive through the partitioned table (writers are
--     granted INSERT on it and on no partition; only the owner can write a
--     partition directly), and the statement triggers below index every row
--     of every INSERT, COPY or UPDATE through it, in the same transaction;
--   - rows archived before this migration lie in the pending range it records,
--     until the partition manager has indexed them all (package plainkeys);
--   - a partition attached with rows in it gets a pending range for its
--     bounds in the transaction that attaches it (package partition).
-- The trigger and the lookup decide "has no timestamp" with the same SQL
-- function, idempotency_key_has_time; the lookup asks it for the key it looks
-- up and reads every partition when it disagrees with the Go parser
-- (package keytime), so a difference between the two can cost time, never a
-- missed row.
--
-- key_hash is the first 64 bits of the key's MD5 (a fixed algorithm, unlike
-- PostgreSQL's internal hash functions): a collision only makes a lookup read
-- one partition more, the key itself is compared in the archive. Nothing
-- here can hold a payload.
CREATE TABLE IF NOT EXISTS idempotency_archive_plain_keys (
    key_hash   bigint      NOT NULL,
    expired_at timestamptz NOT NULL,
    PRIMARY KEY (key_hash, expired_at)
);
-- Retention deletes the rows of months no partition holds any more. Rows
-- arrive roughly in expiry order, as the archive's do.
CREATE INDEX IF NOT EXISTS idempotency_archive_plain_keys_expired_at_brin
    ON idempotency_archive_plain_keys USING brin (expired_at) WITH (pages_per_range = 16);

-- Ranges of expired_at whose archive rows may not all be indexed yet. A lookup
-- of a key without a timestamp also reads the partitions these ranges reach.
-- The partition manager indexes a range in batches, from (after_key,
-- after_expired_at) on in primary-key order, and deletes it when done.
CREATE TABLE IF NOT EXISTS idempotency_archive_plain_keys_pending (
    expired_from     timestamptz NOT NULL,
    expired_to       timestamptz NOT NULL,
    after_key        text COLLATE "C" NOT NULL DEFAULT '',
    after_expired_at timestamptz NOT NULL DEFAULT '-infinity',
    PRIMARY KEY (expired_from, expired_to),
    CHECK (expired_from < expired_to)
);

-- Whether a scoped key carries a timestamp: its last ':'-separated segment is
-- a canonical ULID (26 Crockford base32 characters, the first at most '7') or
-- a hyphenated UUID of version 7 with variant bits 10. The same rule as
-- keytime.FromKey; a test compares the two on fuzzed keys.
CREATE OR REPLACE FUNCTION idempotency_key_has_time(scoped_key text) RETURNS boolean
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
SELECT scoped_key ~ '(^|:)([0-7][0-9A-HJKMNP-TV-Za-hjkmnp-tv-z]{25}|[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-7[0-9A-Fa-f]{3}-[89ABab][0-9A-Fa-f]{3}-[0-9A-Fa-f]{12})$'
$$;

CREATE OR REPLACE FUNCTION idempotency_key_hash(scoped_key text) RETURNS bigint
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
SELECT ('x' || left(md5(scoped_key), 16))::bit(64)::bigint
$$;

-- Indexes the keys without a timestamp among the rows one statement inserted
-- into the archive (rows ON CONFLICT skipped are not among them: they were
-- there already). SECURITY DEFINER: a role that may insert archive rows need
-- not be able to write this table. The tables and functions are the ones
-- beside the archive (TG_TABLE_SCHEMA), under a fixed search_path, so that the
-- definer's rights cannot be redirected.
CREATE OR REPLACE FUNCTION idempotency_index_plain_keys() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    EXECUTE format(
        'INSERT INTO %1$I.idempotency_archive_plain_keys (key_hash, expired_at)
         SELECT %1$I.idempotency_key_hash(scoped_key), expired_at
           FROM archived_rows
          WHERE NOT %1$I.idempotency_key_has_time(scoped_key)
         ON CONFLICT DO NOTHING', TG_TABLE_SCHEMA);
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS idempotency_key_archive_plain_keys ON idempotency_key_archive;
CREATE TRIGGER idempotency_key_archive_plain_keys
    AFTER INSERT ON idempotency_key_archive
    REFERENCING NEW TABLE AS archived_rows
    FOR EACH STATEMENT
    EXECUTE FUNCTION idempotency_index_plain_keys();
-- No role but the owner may update archive rows; an owner's UPDATE that
-- moves a row to another key or expiry (by hand, in an incident) is recorded
-- as well. (A trigger with transition tables takes a single event.)
DROP TRIGGER IF EXISTS idempotency_key_archive_plain_keys_update ON idempotency_key_archive;
CREATE TRIGGER idempotency_key_archive_plain_keys_update
    AFTER UPDATE ON idempotency_key_archive
    REFERENCING NEW TABLE AS archived_rows
    FOR EACH STATEMENT
    EXECUTE FUNCTION idempotency_index_plain_keys();

-- Rows archived before the trigger existed: all of them are pending.
INSERT INTO idempotency_archive_plain_keys_pending (expired_from, expired_to)
SELECT '-infinity', 'infinity'
 WHERE EXISTS (SELECT 1 FROM idempotency_key_archive)
ON CONFLICT DO NOTHING;
