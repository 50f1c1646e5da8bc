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
-- attaches it, and every run calls idempotency_archive_adopt_partition()
-- (below) for every other attached partition, each in a transaction of its
-- own: it marks the partition's bounds pending (when it has rows), gives it
-- the triggers and then adds it. Its rows are then found as those of any
-- pending range are: read in full until the manager has recorded them.
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
SELECT t.relid
  FROM pg_partition_tree(to_regclass('idempotency_key_archive')) t
 WHERE t.level >= 1
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
-- idempotency_archive_partition_triggers(part) creates them on part and on
-- every table of its partition tree (a month partitioned further: a
-- statement may name any of them), those of the archive's schema that lack
-- them (the partition manager calls it for every table it attaches, and
-- idempotency_archive_adopt_partition for every partition it adopts); on a
-- table of another schema it creates none (the recording function writes
-- the tables beside the table it fires on, which another schema lacks: such
-- a partition is adopted and read in full once, and writes into it by name
-- are not recorded). It never drops a trigger: DROP TRIGGER would lock
-- lookups out of the table.
CREATE OR REPLACE FUNCTION idempotency_archive_partition_triggers(part regclass) RETURNS void
    LANGUAGE plpgsql AS $$
DECLARE
    -- The name itself, not regnamespace's text, which is quoted already
    -- (edited after release, see migration 014: same behaviour for every
    -- schema whose name needs no quoting).
    archive_schema name := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                             WHERE c.oid = to_regclass('idempotency_key_archive'));
    tbl            regclass;
BEGIN
    FOR tbl IN
        SELECT t.relid FROM pg_partition_tree(part) t JOIN pg_class c ON c.oid = t.relid
          JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = archive_schema
    LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = tbl AND tgname = 'idempotency_key_archive_plain_keys') THEN
            EXECUTE format('CREATE TRIGGER idempotency_key_archive_plain_keys AFTER INSERT ON %s
                            REFERENCING NEW TABLE AS archived_rows FOR EACH STATEMENT
                            EXECUTE FUNCTION %I.idempotency_index_plain_keys()', tbl, archive_schema);
        END IF;
        IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = tbl AND tgname = 'idempotency_key_archive_plain_keys_update') THEN
            EXECUTE format('CREATE TRIGGER idempotency_key_archive_plain_keys_update AFTER UPDATE ON %s
                            REFERENCING NEW TABLE AS archived_rows FOR EACH STATEMENT
                            EXECUTE FUNCTION %I.idempotency_index_plain_keys()', tbl, archive_schema);
        END IF;
    END LOOP;
END
$$;

-- Adopts part, a table of the archive's partition tree (a month, or a
-- table attached to a month that is partitioned itself), when it is not
-- recorded yet, and returns '' when it did; NULL, having done nothing, when it is recorded
-- already, no longer attached, or its writers never left it free for 5 s
-- (the next run tries again). When its triggers cannot be created (a table
-- owned by a role the manager's is not), its rows are still marked pending,
-- but it is not recorded, and the error is returned: the partition manager
-- reports it, and its next run tries again.
--
-- The partition is locked SHARE ROW EXCLUSIVE first, which every DETACH,
-- ATTACH and write of it conflicts with, so that the bound read is the one
-- it keeps until the commit and no row lands unrecorded between the pending
-- mark and its triggers. Taken without waiting, every 50 ms for up to 5 s:
-- archive inserts into the month (sweep batches, a Redis store's
-- completions) never queue behind a lock request that waits. The caller
-- runs each partition in a transaction of its own, so that no lock is held
-- while another is tried. The range marked is the bound of part's month
-- (its ancestor attached to the archive), which holds every row of part; a
-- bound that is not a range of timestamps (DEFAULT, a value this reads
-- otherwise) marks every expiry pending. Every table of part's own tree is
-- recorded with it: the mark covers their rows, and they get the triggers. The
-- pending mark is the partition manager's own (package partition,
-- pendingStatement): a range pending already starts over, and migration
-- 010's trigger copies it for the late-key rule.
CREATE OR REPLACE FUNCTION idempotency_archive_adopt_partition(part oid) RETURNS text
    LANGUAGE plpgsql
    SET TimeZone = 'UTC' SET DateStyle = 'ISO, YMD'
AS $$
DECLARE
    archive  regclass := to_regclass('idempotency_key_archive');
    month    oid;
    bound    text;
    m        text[];
    lo       timestamptz;
    hi       timestamptz;
    has_rows boolean;
    locked   boolean := false;
BEGIN
    IF EXISTS (SELECT 1 FROM idempotency_archive_recorded_partitions WHERE partition = part) THEN
        RETURN NULL;
    END IF;
    FOR attempt IN 1..100 LOOP
        BEGIN
            EXECUTE format('LOCK TABLE %s IN SHARE ROW EXCLUSIVE MODE NOWAIT', part::regclass);
            locked := true;
            EXIT;
        EXCEPTION
            WHEN lock_not_available THEN
                PERFORM pg_sleep(0.05);
            WHEN undefined_table THEN
                RETURN NULL; -- dropped meanwhile
        END;
    END LOOP;
    IF NOT locked THEN
        RETURN NULL;
    END IF;
    -- Still in the archive's tree, by attachments none of which is a
    -- pending detach (read after the lock: no DETACH of part can be under
    -- way now), and its month.
    SELECT a.relid INTO month
      FROM pg_partition_ancestors(part) a
      JOIN pg_inherits i ON i.inhrelid = a.relid
     WHERE i.inhparent = archive;
    IF NOT FOUND OR EXISTS (SELECT 1 FROM pg_partition_ancestors(part) a
                              JOIN pg_inherits i ON i.inhrelid = a.relid
                             WHERE i.inhdetachpending) THEN
        RETURN NULL; -- detached before the lock was granted
    END IF;
    SELECT pg_get_expr(c.relpartbound, c.oid) INTO bound FROM pg_class c WHERE c.oid = month;
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
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM %s)', part::regclass) INTO has_rows;
    IF has_rows THEN
        INSERT INTO idempotency_archive_plain_keys_pending (expired_from, expired_to)
        VALUES (lo, hi)
        ON CONFLICT (expired_from, expired_to) DO UPDATE SET after_key = '', after_expired_at = '-infinity';
    END IF;
    BEGIN
        PERFORM idempotency_archive_partition_triggers(part::regclass);
    EXCEPTION WHEN OTHERS THEN
        RETURN SQLERRM;
    END;
    INSERT INTO idempotency_archive_recorded_partitions (partition)
    SELECT t.relid FROM pg_partition_tree(part) t
    ON CONFLICT (partition) DO NOTHING;
    RETURN '';
END
$$;

-- Every partition attached now gets the triggers. The partitions are locked
-- SHARE ROW EXCLUSIVE (what CREATE TRIGGER takes) all together, without
-- waiting, every 50 ms for up to two minutes, in a subtransaction that gives
-- them all back when one is not free, as migration 010 does: archive inserts
-- (a sweep batch, a Redis store's completion) never queue behind a lock
-- request that waits, nor wait for a lock held while another is tried. The
-- locks are held to the commit, milliseconds later; lookups go on
-- throughout.
DO $$
DECLARE
    part regclass;
BEGIN
    FOR attempt IN 1..2400 LOOP
        BEGIN
            FOR part IN
                SELECT i.inhrelid::regclass FROM pg_inherits i
                 WHERE i.inhparent = to_regclass('idempotency_key_archive') AND NOT i.inhdetachpending
            LOOP
                EXECUTE format('LOCK TABLE %s IN SHARE ROW EXCLUSIVE MODE NOWAIT', part);
            END LOOP;
            EXIT;
        EXCEPTION WHEN lock_not_available THEN
            IF attempt = 2400 THEN
                RAISE EXCEPTION 'migration 012: the archive''s partitions were never all free of writers at once for two minutes; run the migration again'
                    USING ERRCODE = 'lock_not_available';
            END IF;
            PERFORM pg_sleep(0.05);
        END;
    END LOOP;
    -- A partition this migration may not give triggers (owned by another
    -- role) is forgotten instead: the next partitions run adopts it, after
    -- migrate has made idempotency_owner its owner, or reports it.
    FOR part IN
        SELECT i.inhrelid::regclass FROM pg_inherits i
         WHERE i.inhparent = to_regclass('idempotency_key_archive') AND NOT i.inhdetachpending
    LOOP
        BEGIN
            PERFORM idempotency_archive_partition_triggers(part);
        EXCEPTION WHEN insufficient_privilege THEN
            DELETE FROM idempotency_archive_recorded_partitions
             WHERE partition IN (SELECT t.relid FROM pg_partition_tree(part) t);
        END;
    END LOOP;
END
$$;
