-- Which partitions of the archive the records of migrations 006 and 010
-- vouch for, so that a table attached by anyone but the partition manager
-- (an owner's ALTER TABLE ... ATTACH PARTITION of a month restored from a
-- dump) is found and its rows marked pending.
--
-- The invariant lookups rest on (migrations 006 and 010): every archive row
-- of a key without a timestamp, and every row of a timestamped key that
-- expired past its prompt span, has a record in
-- idempotency_archive_plain_keys or lies in a pending range. Rows reach a
-- partition through the archive's triggers, or already in it when it is
-- attached; the partition manager marks the bounds of every table it
-- attaches pending (package partition, attachStatements), but an ATTACH by
-- hand marks nothing, and no trigger fires on it. A lookup of a key whose
-- rows only such a table holds would answer not found: a late retry would
-- run twice.
--
-- So: idempotency_archive_recorded_partitions holds the partitions whose rows
-- the records cover (by OID: a table restored from a dump, detached and
-- dropped, or created anew under the same name is another table). The
-- partition manager adds each table it attaches in the transaction that
-- attaches it, and every run calls idempotency_archive_adopt_partitions()
-- (below), which marks the bounds of every other attached partition pending
-- (when it has rows) and then adds it. Its rows are then found as those of
-- any pending range are: read in full until the manager has recorded them.
-- Between a hand ATTACH and the next partitions run, lookups can still miss
-- them (README: restore a month by leaving the table detached under its
-- month's name, which the manager attaches itself).
--
-- The partitions attached when this migration runs are taken as covered:
-- the manager attached them, or the README's remedies for rows written
-- around the triggers apply to them as before.
CREATE TABLE IF NOT EXISTS idempotency_archive_recorded_partitions (
    partition oid PRIMARY KEY
);

INSERT INTO idempotency_archive_recorded_partitions (partition)
SELECT i.inhrelid
  FROM pg_inherits i
 WHERE i.inhparent = to_regclass('idempotency_key_archive')
ON CONFLICT (partition) DO NOTHING;

-- Adopts every attached partition not in idempotency_archive_recorded_partitions
-- and returns the names of those adopted; forgets the OIDs of tables that
-- are no longer partitions of the archive first (an OID may be reused by a
-- later table). Each partition is locked SHARE UPDATE EXCLUSIVE first, which
-- every DETACH and ATTACH of it conflicts with, so that the bound read is
-- the one it keeps until the commit. A bound that is not a range of
-- timestamps (DEFAULT, a value this reads otherwise) marks every expiry
-- pending. The pending mark is the partition manager's own (package
-- partition, pendingStatement): a range pending already starts over, and
-- migration 010's trigger copies it for the late-key rule.
CREATE OR REPLACE FUNCTION idempotency_archive_adopt_partitions() RETURNS SETOF text
    LANGUAGE plpgsql
    SET TimeZone = 'UTC' SET DateStyle = 'ISO, YMD'
AS $$
DECLARE
    archive  regclass := to_regclass('idempotency_key_archive');
    part     record;
    bound    text;
    m        text[];
    lo       timestamptz;
    hi       timestamptz;
    has_rows boolean;
BEGIN
    DELETE FROM idempotency_archive_recorded_partitions r
     WHERE NOT EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhrelid = r.partition AND i.inhparent = archive);
    FOR part IN
        SELECT c.oid, n.nspname, c.relname
          FROM pg_inherits i
          JOIN pg_class c ON c.oid = i.inhrelid
          JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE i.inhparent = archive AND NOT i.inhdetachpending
           AND NOT EXISTS (SELECT 1 FROM idempotency_archive_recorded_partitions r WHERE r.partition = c.oid)
         ORDER BY c.relname
    LOOP
        EXECUTE format('LOCK TABLE %I.%I IN SHARE UPDATE EXCLUSIVE MODE', part.nspname, part.relname);
        SELECT pg_get_expr(c.relpartbound, c.oid) INTO bound
          FROM pg_class c JOIN pg_inherits i ON i.inhrelid = c.oid
         WHERE c.oid = part.oid AND i.inhparent = archive AND NOT i.inhdetachpending;
        CONTINUE WHEN NOT FOUND; -- detached before the lock was granted
        m := regexp_match(bound, '^FOR VALUES FROM \((MINVALUE|''[^'']*'')\) TO \((MAXVALUE|''[^'']*'')\)$');
        lo := '-infinity';
        hi := 'infinity';
        IF m IS NOT NULL THEN
            IF m[1] <> 'MINVALUE' THEN
                lo := btrim(m[1], '''')::timestamptz;
            END IF;
            IF m[2] <> 'MAXVALUE' THEN
                hi := btrim(m[2], '''')::timestamptz;
            END IF;
        END IF;
        IF NOT lo < hi THEN
            lo := '-infinity';
            hi := 'infinity';
        END IF;
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I.%I)', part.nspname, part.relname) INTO has_rows;
        IF has_rows THEN
            INSERT INTO idempotency_archive_plain_keys_pending (expired_from, expired_to)
            VALUES (lo, hi)
            ON CONFLICT (expired_from, expired_to) DO UPDATE SET after_key = '', after_expired_at = '-infinity';
        END IF;
        INSERT INTO idempotency_archive_recorded_partitions (partition) VALUES (part.oid)
        ON CONFLICT (partition) DO NOTHING;
        RETURN NEXT part.relname;
    END LOOP;
END
$$;
