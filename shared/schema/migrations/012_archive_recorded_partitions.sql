-- Which partitions of the archive the records of migrations 006 and 010
-- vouch for, so that a table attached by anyone but the partition manager
-- (an owner's ALTER TABLE ... ATTACH PARTITION of a month restored from a
-- dump) is found and its rows marked pending; and the archive's recording
-- triggers on every partition, so that rows written into one by name are
-- recorded too.
--
-- The invariant lookups rest on (migrations 006 and 010): every archive row
-- of a key without a timestamp, and every row of a timestamped key that
-- expired past its prompt span, has a record in
-- idempotency_archive_plain_keys or lies in a pending range. Rows reach a
-- partition through the archive's triggers, through statements that name
-- the partition (recorded by its own triggers, below), or already in it when
-- it is attached; the partition manager marks the bounds of every table it
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
-- (when it has rows), gives it the triggers and then adds it. Its rows are then found as those of
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

-- The archive's recording triggers on each partition too, so that rows
-- written into a partition directly are recorded as rows written through
-- the archive are.
--
-- Migrations 006 and 010 record, for lookups, where the rows of keys without
-- a timestamp (and of keys used long after their timestamp) lie, from
-- statement triggers on idempotency_key_archive. PostgreSQL fires a
-- statement trigger only on the table a statement names: an INSERT, COPY or
-- UPDATE that names a partition (an owner's pg_restore --data-only -t of one
-- month, a COPY into a month table, rows loaded into a month while it was
-- detached) fired none, and lookups missed those rows. The same triggers on
-- each partition fire for exactly those statements (a statement through the
-- archive fires only the archive's): every row is recorded once, by the
-- triggers of the table its statement named.
--
-- idempotency_archive_partition_triggers(part) creates them on a table of
-- the archive's schema that lacks them (the partition manager calls it for
-- every table it attaches, and idempotency_archive_adopt_partitions for every
-- partition it adopts); on a table of another schema it creates none (the
-- recording function writes the tables beside the table it fires on, which
-- another schema lacks: such a partition is adopted and read in full once,
-- and writes into it directly are not recorded). It never drops a trigger:
-- DROP TRIGGER would lock lookups out of the table.
CREATE OR REPLACE FUNCTION idempotency_archive_partition_triggers(part regclass) RETURNS void
    LANGUAGE plpgsql AS $$
DECLARE
    archive_schema name := (SELECT relnamespace::regnamespace::name FROM pg_class
                             WHERE oid = to_regclass('idempotency_key_archive'));
    part_schema    name := (SELECT relnamespace::regnamespace::name FROM pg_class WHERE oid = part);
BEGIN
    IF part_schema IS DISTINCT FROM archive_schema THEN
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = part AND tgname = 'idempotency_key_archive_plain_keys') THEN
        EXECUTE format('CREATE TRIGGER idempotency_key_archive_plain_keys AFTER INSERT ON %s
                        REFERENCING NEW TABLE AS archived_rows FOR EACH STATEMENT
                        EXECUTE FUNCTION %I.idempotency_index_plain_keys()', part, archive_schema);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = part AND tgname = 'idempotency_key_archive_plain_keys_update') THEN
        EXECUTE format('CREATE TRIGGER idempotency_key_archive_plain_keys_update AFTER UPDATE ON %s
                        REFERENCING NEW TABLE AS archived_rows FOR EACH STATEMENT
                        EXECUTE FUNCTION %I.idempotency_index_plain_keys()', part, archive_schema);
    END IF;
END
$$;

-- Adopts every attached partition not in idempotency_archive_recorded_partitions
-- and returns the names of those adopted; forgets the OIDs of tables that
-- are no longer partitions of the archive first (an OID may be reused by a
-- later table). Each partition is locked SHARE ROW EXCLUSIVE first, which
-- every DETACH, ATTACH and write of it conflicts with, so that the bound
-- read is the one it keeps until the commit and no row lands unrecorded
-- between the pending mark and its triggers. A bound that is not a range of
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
    locked   boolean;
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
        -- SHARE ROW EXCLUSIVE: every DETACH and ATTACH of it, and every
        -- write into it, waits until the commit, so that the bound read is
        -- the one it keeps and no row lands between the pending mark and the
        -- triggers (CREATE TRIGGER takes this lock too). Taken without
        -- waiting, every 50 ms for up to 5 s, as the migration below does:
        -- archive inserts into the month (sweep batches, a Redis store's
        -- completions) never queue behind a lock request that waits. A
        -- partition never free for that long is left for the next run.
        locked := false;
        FOR attempt IN 1..100 LOOP
            BEGIN
                EXECUTE format('LOCK TABLE %I.%I IN SHARE ROW EXCLUSIVE MODE NOWAIT', part.nspname, part.relname);
                locked := true;
                EXIT;
            EXCEPTION WHEN lock_not_available THEN
                PERFORM pg_sleep(0.05);
            END;
        END LOOP;
        CONTINUE WHEN NOT locked;
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
        PERFORM idempotency_archive_partition_triggers(part.oid::regclass);
        INSERT INTO idempotency_archive_recorded_partitions (partition) VALUES (part.oid)
        ON CONFLICT (partition) DO NOTHING;
        RETURN NEXT part.relname;
    END LOOP;
END
$$;

-- Every partition attached now gets them. Each is locked SHARE ROW
-- EXCLUSIVE (what CREATE TRIGGER takes) without waiting, every 50 ms for up
-- to two minutes, in a subtransaction, as migration 010 does: archive
-- inserts (a sweep batch, a Redis store's completion) never queue behind a
-- lock request that waits. The locks are held to the commit, milliseconds
-- later; lookups go on throughout.
DO $$
DECLARE
    part regclass;
BEGIN
    FOR part IN
        SELECT i.inhrelid::regclass
          FROM pg_inherits i
         WHERE i.inhparent = to_regclass('idempotency_key_archive') AND NOT i.inhdetachpending
         ORDER BY 1
    LOOP
        FOR attempt IN 1..2400 LOOP
            BEGIN
                EXECUTE format('LOCK TABLE %s IN SHARE ROW EXCLUSIVE MODE NOWAIT', part);
                EXIT;
            EXCEPTION WHEN lock_not_available THEN
                IF attempt = 2400 THEN
                    RAISE EXCEPTION 'migration 012: partition % was never free of writers for two minutes; run the migration again', part
                        USING ERRCODE = 'lock_not_available';
                END IF;
                PERFORM pg_sleep(0.05);
            END;
        END LOOP;
        PERFORM idempotency_archive_partition_triggers(part);
    END LOOP;
END
$$;
