-- Where the archived rows of timestamped keys used long after their
-- timestamp are.
--
-- A ULID or UUIDv7 key bounds its archive rows' expiries from below (its
-- timestamp minus the writers' skew, see package keytime) but not from above:
-- a key minted in 2020 may have been first used today. So a lookup of a key
-- minted years ago read every partition from its month to now. Nearly every
-- key is used within moments of being minted, and expires one TTL later.
-- This migration records, in idempotency_archive_plain_keys, the rows that
-- expired more than the prompt span (idempotency_key_prompt_span(), 192
-- hours) after their key's timestamp, so that a lookup reads the months of
-- the span and then only the partitions of the expiries recorded.
--
-- The invariant: every archive row of a key with a timestamp ts whose
-- expired_at lies later than ts + the prompt span has a row in
-- idempotency_archive_plain_keys, or lies in a range of
-- idempotency_archive_plain_keys_pending or of
-- idempotency_archive_late_keys_pending. It holds for the reasons migration
-- 006 gives for keys without a timestamp: the archive's statement triggers
-- record every row of every INSERT, COPY or UPDATE, in the same transaction;
-- rows archived before this migration lie in the pending range it records
-- below, until the partition manager has recorded them (package plainkeys);
-- a partition attached with rows gets a pending range for its bounds.
-- Recording more rows than the rule asks for costs space, never a missed
-- row, and the trigger does (below).
--
-- A lookup in the late range of a key (package archive) reads
-- idempotency_archive_plain_keys by the key's hash, and both pending tables.

-- The span, exact hours (an interval of days would follow the session's
-- TimeZone across a DST change). archive.PromptSpan is the same; a lookup
-- compares the two and reads every partition from the key's month on when
-- they differ.
CREATE OR REPLACE FUNCTION idempotency_key_prompt_span() RETURNS interval
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT interval '192 hours' $$;

-- Ranges of expired_at whose rows may not all have been recorded under this
-- migration's rule yet. Unlike idempotency_archive_plain_keys_pending, a
-- lookup of a key without a timestamp does not read them: its rows were
-- recorded already. The partition manager records them as it records that
-- table's ranges (package plainkeys), under both rules.
CREATE TABLE IF NOT EXISTS idempotency_archive_late_keys_pending (
    expired_from     timestamptz NOT NULL,
    expired_to       timestamptz NOT NULL,
    after_key        text COLLATE "C" NOT NULL DEFAULT '',
    after_expired_at timestamptz NOT NULL DEFAULT '-infinity',
    PRIMARY KEY (expired_from, expired_to),
    CHECK (expired_from < expired_to)
);

-- No archive row is inserted from here to the commit (lookups go on): a
-- sweep batch that inserted under the previous trigger and committed after
-- this migration would be neither recorded under the new rule nor seen by
-- the EXISTS at the end. SHARE ROW EXCLUSIVE on the partitioned table, which
-- every writer inserts through (migration 006), lets the inserts under way
-- end and holds new ones until the commit, after which they run the new
-- trigger. The same on idempotency_archive_plain_keys_pending, which the
-- trigger below is created on, holds the partition manager's writes there
-- until the commit: a range marked before it is committed, its rows visible
-- to that EXISTS. Both locks are tried together without waiting, every 50 ms
-- for up to two minutes, in a subtransaction that gives both back when
-- either is not free: inserts never queue behind a lock request that waits
-- (on a long batch, a DETACH ... CONCURRENTLY), so a completion's archive
-- write stays as short as a batch's, and the partition manager is never
-- held up by a migration waiting for the archive. The statements from here
-- to the commit wait for nothing else.
DO $$
BEGIN
    FOR attempt IN 1..2400 LOOP
        BEGIN
            LOCK TABLE ONLY idempotency_archive_plain_keys_pending IN SHARE ROW EXCLUSIVE MODE NOWAIT;
            LOCK TABLE ONLY idempotency_key_archive IN SHARE ROW EXCLUSIVE MODE NOWAIT;
            RETURN;
        EXCEPTION WHEN lock_not_available THEN
            PERFORM pg_sleep(0.05);
        END;
    END LOOP;
    RAISE EXCEPTION 'migration 010: idempotency_key_archive and idempotency_archive_plain_keys_pending were never both free of writers for two minutes; run the migration again'
        USING ERRCODE = 'lock_not_available';
END
$$;

-- Every range marked pending under migration 006's rule (a partition
-- attached with rows, by any release of the partition manager) is pending
-- under this one too. A partition manager from before this migration (a
-- deploy whose function code is not yet, or no longer after a rollback, the
-- schema's) records a range's rows under 006's rule alone and then deletes
-- the range: the copy here, which it never reads, keeps their late rows
-- pending until a partition manager that knows this rule records them. A
-- range marked again (ON CONFLICT ... DO UPDATE resets its progress) is
-- reset here too. The current partition manager carries the copy along
-- with the range it copies (package plainkeys), scanning it once.
CREATE OR REPLACE FUNCTION idempotency_copy_pending_range() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    EXECUTE format(
        'INSERT INTO %I.idempotency_archive_late_keys_pending (expired_from, expired_to) VALUES ($1, $2)
         ON CONFLICT (expired_from, expired_to) DO UPDATE SET after_key = DEFAULT, after_expired_at = DEFAULT', TG_TABLE_SCHEMA)
        USING NEW.expired_from, NEW.expired_to;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS idempotency_copy_pending_range ON idempotency_archive_plain_keys_pending;
CREATE TRIGGER idempotency_copy_pending_range
    AFTER INSERT OR UPDATE ON idempotency_archive_plain_keys_pending
    FOR EACH ROW
    WHEN (NEW.after_key = '' AND NEW.after_expired_at = '-infinity')
    EXECUTE FUNCTION idempotency_copy_pending_range();

-- The first characters of a key that encode instant's Unix milliseconds,
-- rounded up to a whole millisecond: ten Crockford base32 characters, upper
-- case, for a ULID (ulid true), else twelve lower-case hex digits, a UUIDv7's
-- first twelve without its dash. Compared as text in the "C" collation, a
-- key's prefix sorts below it exactly when the key's timestamp lies before
-- instant: both alphabets are in ASCII order and the widths are fixed.
-- Instants no key's timestamp lies before (up to the Unix epoch) give '';
-- instants every key's lies before (from 2^48 ms on, year 10889, and
-- 'infinity') give a string above every prefix ('8': a ULID starts with 0-7;
-- 'g': above every hex digit). Called once a statement, never per row.
CREATE OR REPLACE FUNCTION idempotency_key_time_bound(instant timestamptz, ulid boolean) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
SELECT CASE
       WHEN instant IS NULL OR ulid IS NULL THEN NULL
       WHEN instant = '-infinity' OR ms <= 0 THEN ''
       WHEN instant = 'infinity' OR ms >= 281474976710656 THEN CASE WHEN ulid THEN '8' ELSE 'g' END
       WHEN ulid THEN (SELECT string_agg(substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ',
                                                ((ms >> (5 * (9 - i))) & 31)::int + 1, 1), '' ORDER BY i)
                         FROM generate_series(0, 9) AS i)
       ELSE lpad(to_hex(ms), 12, '0')
       END
  FROM (SELECT CASE WHEN isfinite(instant) THEN ceil(extract(epoch FROM instant) * 1000)::bigint END AS ms) AS t
$$;

-- Whether the timestamp of a key that has one (idempotency_key_has_time)
-- lies before the instant whose bounds idempotency_key_time_bound gave.
-- Meaningless for other keys. Not STRICT, so that it is inlined (see
-- migration 007). A ULID's letters may be lower case; upper() under the "C"
-- collation changes ASCII letters only.
CREATE OR REPLACE FUNCTION idempotency_key_time_before(scoped_key text, ulid_bound text, uuid_bound text) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
SELECT CASE length(split_part(scoped_key, ':', -1))
       WHEN 26 THEN upper(left(split_part(scoped_key, ':', -1), 10) COLLATE "C") < (ulid_bound COLLATE "C")
       WHEN 36 THEN lower((left(split_part(scoped_key, ':', -1), 8) || substr(split_part(scoped_key, ':', -1), 10, 4)) COLLATE "C")
                    < (uuid_bound COLLATE "C")
       ELSE false
       END
$$;

-- The instant before which a key's timestamp makes a row that expired at
-- expired late: expired less span, the prompt span (passed in: this runs
-- under the trigger's search_path). Where that arithmetic would leave
-- PostgreSQL's range (expiries written by hand, BC or near year 294276), an
-- infinity that gives the same verdict: no key's timestamp lies before the
-- Unix epoch, and every key's lies before year 10890.
CREATE OR REPLACE FUNCTION idempotency_key_late_bound(expired timestamptz, span interval) RETURNS timestamptz
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
SELECT CASE
       WHEN NOT isfinite(expired) THEN expired
       WHEN expired < 'epoch' THEN '-infinity'
       WHEN expired >= '10890-01-01 00:00:00+00' THEN 'infinity'
       ELSE expired - span
       END
$$;

-- The UTC hour an expiry falls in, as its first instant: the group whose
-- bound the trigger and the partition manager encode once for many rows.
-- Expiries far from now (which date_bin cannot subtract from the epoch
-- near year 294276) are their own group: late_bound gives them an infinity.
CREATE OR REPLACE FUNCTION idempotency_key_expiry_hour(expired timestamptz) RETURNS timestamptz
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
SELECT CASE WHEN expired >= 'epoch' AND expired < '10890-01-01 00:00:00+00'
            THEN date_bin('1 hour', expired, 'epoch') ELSE expired END
$$;

-- The trigger of migrations 006 and 007, recording late rows too.
--
-- A row is recorded when its key has no timestamp, or when the key's
-- timestamp lies before a bound at or after the row's expiry, less the
-- prompt span. Why every late row is recorded (the invariant above): a late
-- row has ts < expired_at - span, and expired_at is at most the bound, so ts
-- lies before the bound less the span too. The bound is the latest expiry
-- among the statement's rows when they all expire within an hour of each
-- other (a sweep batch, which claims the oldest expiries first and spans
-- minutes of them; a single row, for which it is exact), else the end of
-- each row's UTC hour (a bulk import). Either way it is encoded once (an
-- hour), and each row costs a comparison of two short strings: about 4 ms
-- of a sweep batch of 10,000 rows on 2 cores, where the hourly bound's join
-- cost 15 ms more. The rows recorded beyond the rule are those whose key
-- was used up to an hour less late than the span.
CREATE OR REPLACE FUNCTION idempotency_index_plain_keys() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    oldest     timestamptz;
    newest     timestamptz;
    ulid_bound text;
    uuid_bound text;
    entries    text;
BEGIN
    EXECUTE 'SELECT min(expired_at), max(expired_at) FROM archived_rows' INTO oldest, newest;
    -- In seconds: the interval between 4713 BC and 294276 AD overflows.
    IF isfinite(oldest) AND isfinite(newest) AND extract(epoch FROM newest) - extract(epoch FROM oldest) <= 3600 THEN
        EXECUTE format(
            'SELECT %1$I.idempotency_key_time_bound(b, true), %1$I.idempotency_key_time_bound(b, false)
               FROM (SELECT %1$I.idempotency_key_late_bound($1, %1$I.idempotency_key_prompt_span())) AS t (b)', TG_TABLE_SCHEMA)
            INTO ulid_bound, uuid_bound USING newest;
        entries := format(
            'INSERT INTO %1$I.idempotency_archive_plain_keys (key_hash, expired_at)
             SELECT %1$I.idempotency_key_hash(scoped_key), expired_at
               FROM archived_rows
              WHERE NOT %1$I.idempotency_key_has_time(scoped_key)
                 OR %1$I.idempotency_key_time_before(scoped_key, $1, $2)', TG_TABLE_SCHEMA);
    ELSE
        -- Infinite expiries too (PostgreSQL cannot subtract them).
        -- MATERIALIZED: the bounds are computed once an hour, not once a row.
        entries := format(
            'WITH bounds AS MATERIALIZED (
                 SELECT h, %1$I.idempotency_key_time_bound(b, true) AS ulid, %1$I.idempotency_key_time_bound(b, false) AS uuid
                   FROM (SELECT h, %1$I.idempotency_key_late_bound(h, %1$I.idempotency_key_prompt_span() - interval ''1 hour'')
                           FROM (SELECT DISTINCT %1$I.idempotency_key_expiry_hour(expired_at) FROM archived_rows) AS hours (h)) AS t (h, b)
             )
             INSERT INTO %1$I.idempotency_archive_plain_keys (key_hash, expired_at)
             SELECT %1$I.idempotency_key_hash(a.scoped_key), a.expired_at
               FROM archived_rows AS a
               JOIN bounds AS b ON b.h = %1$I.idempotency_key_expiry_hour(a.expired_at)
              WHERE NOT %1$I.idempotency_key_has_time(a.scoped_key)
                 OR %1$I.idempotency_key_time_before(a.scoped_key, b.ulid, b.uuid)', TG_TABLE_SCHEMA);
    END IF;
    IF TG_OP = 'INSERT' AND current_setting('idemarchive.bulk_archive', true) = 'on' THEN
        BEGIN
            EXECUTE entries USING ulid_bound, uuid_bound;
            RETURN NULL;
        EXCEPTION WHEN unique_violation THEN
            NULL; -- an entry exists: insert them all again, below
        END;
    END IF;
    EXECUTE entries || ' ON CONFLICT DO NOTHING' USING ulid_bound, uuid_bound;
    RETURN NULL;
END
$$;

-- Rows archived before this migration: all of them are pending.
INSERT INTO idempotency_archive_late_keys_pending (expired_from, expired_to)
SELECT '-infinity', 'infinity'
 WHERE EXISTS (SELECT 1 FROM idempotency_key_archive)
ON CONFLICT DO NOTHING;
