-- The plain-key trigger of migration 006, cheaper: it cost 55-75 ms of a
-- sweep batch of 10,000 rows on 2 cores, a third of the batch.
--
-- 1. The same rule for "has a timestamp", about three times cheaper. The
-- trigger asks it of every archived row, and it was the largest part of the
-- trigger's cost: matching '(^|:)(ULID|UUIDv7)$' against
-- the whole key tries the pattern from every ':' and every position, about
-- 4.8 µs a key on 2 cores. This version takes the last ':'-separated segment
-- once (split_part with -1, a C function), dispatches on its length (a ULID
-- has 26 characters, a hyphenated UUID 36, anything else has no timestamp
-- and needs no pattern at all) and anchors the pattern to that segment:
-- about 1.3 µs for a ULID, 3.6 µs for a UUIDv7 and 0.2 µs for a key without
-- a timestamp.
--
-- Why this is the same rule (the invariant every plain-key entry depends on):
-- neither pattern can match a ':', so '(^|:)X$' matches a key exactly when
-- its last ':'-separated segment (the whole key when it has no ':') matches
-- '^X$'; and every string X matches has 26 characters (the ULID) or 36 (the
-- UUID), which length() counts as characters, as the pattern does. The test
-- FuzzKeyTimeRuleMatchesSQL holds both to keytime.FromKey.
--
-- Not STRICT, so that PostgreSQL inlines it into the statements that call it
-- (a STRICT SQL function whose body is not itself strict is called, not
-- inlined, at several µs a call); a NULL key still gives NULL, as before.
CREATE OR REPLACE FUNCTION idempotency_key_has_time(scoped_key text) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
SELECT CASE length(split_part(scoped_key, ':', -1))
       WHEN 26 THEN split_part(scoped_key, ':', -1) ~ '^[0-7][0-9A-HJKMNP-TV-Za-hjkmnp-tv-z]{25}$'
       WHEN 36 THEN split_part(scoped_key, ':', -1) ~ '^[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-7[0-9A-Fa-f]{3}-[89ABab][0-9A-Fa-f]{3}-[0-9A-Fa-f]{12}$'
       ELSE CASE WHEN scoped_key IS NULL THEN NULL ELSE false END
       END
$$;

-- 2. In a sweep batch, the trigger inserts without ON CONFLICT first.
-- Speculative insertion costs an extra probe, WAL record and buffer lock a
-- row (3.4 µs a row here), and an entry rarely exists already: the archive's
-- primary key keeps a statement from inserting a key and expiry twice, so an
-- entry exists only when the row was deleted from the archive and inserted
-- again, when two keys' 64-bit hashes collide at the same expiry, or when an
-- owner's UPDATE leaves a row's key and expiry as they were. Why this is safe
-- (the invariant): the first INSERT runs in a block with an exception
-- handler, a subtransaction, so a unique violation undoes all of it, and the
-- handler inserts the same rows again with ON CONFLICT DO NOTHING. Either way
-- every row of the statement has its entry when the trigger returns, and the
-- archive insert never fails for an entry that exists.
--
-- The subtransaction takes a transaction id of its own, one a statement: a
-- cost only a statement of many rows repays. So the plain insert is tried
-- only when the transaction says it archives in bulk (the sweeper sets
-- idemarchive.bulk_archive to 'on' for its batch transactions); every other
-- statement (a Redis store's single row at completion, an UPDATE, an
-- operator's script of many small INSERTs) inserts with ON CONFLICT DO
-- NOTHING directly, as under migration 006. Any session may set the
-- setting: it only chooses between two paths that both record every row. It
-- is meant for transactions of one large statement, as the sweeper's are: a
-- transaction of many small archive INSERTs with it on pays a subtransaction
-- each, and past 64 of them PostgreSQL's snapshots slow down until it ends.
CREATE OR REPLACE FUNCTION idempotency_index_plain_keys() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    entries constant text := format(
        'INSERT INTO %1$I.idempotency_archive_plain_keys (key_hash, expired_at)
         SELECT %1$I.idempotency_key_hash(scoped_key), expired_at
           FROM archived_rows
          WHERE NOT %1$I.idempotency_key_has_time(scoped_key)', TG_TABLE_SCHEMA);
BEGIN
    IF TG_OP = 'INSERT' AND current_setting('idemarchive.bulk_archive', true) = 'on' THEN
        BEGIN
            EXECUTE entries;
            RETURN NULL;
        EXCEPTION WHEN unique_violation THEN
            NULL; -- an entry exists: insert them all again, below
        END;
    END IF;
    EXECUTE entries || ' ON CONFLICT DO NOTHING';
    RETURN NULL;
END
$$;
