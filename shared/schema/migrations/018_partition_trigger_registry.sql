-- The partitions' recording triggers are vouched for as the archive's are
-- (migration 017), so that turning them off and on again is seen.
--
-- What broke: pg_restore --data-only --disable-triggers restores a
-- partitioned table partition by partition: ALTER TABLE <month> DISABLE
-- TRIGGER ALL, COPY <month>, ALTER TABLE <month> ENABLE TRIGGER ALL. The
-- restored rows of keys without a timestamp were never recorded, and the
-- next partitions run, which reads the triggers only as they are, found
-- every partition whole: those keys were answered not found for good
-- unless the owner marked their expiries pending by hand. The same held for
-- a clone of the archive's row trigger turned off around an owner's MERGE
-- that moved rows between months.
--
-- idempotency_archive_recorded_partition_triggers holds each recording
-- trigger of each partition, by OID and xmin, as the adoption (or the
-- manager's attachment, or this migration) found it whole. A partition
-- counts as triggered only while each of its recording triggers is recorded
-- so; otherwise the next run adopts it again, which marks its bounds
-- pending (its rows are read in full until recorded) and vouches for its
-- triggers as they are then.
CREATE TABLE IF NOT EXISTS idempotency_archive_recorded_partition_triggers (
    trigger   oid PRIMARY KEY,
    written   xid NOT NULL,
    partition oid NOT NULL
);

-- idempotency_archive_vouch_partition_triggers(part): records the recording
-- triggers of part's tree as they are now, in place of what the registry
-- held for it (and of entries whose trigger no longer exists).
--
-- idempotency_archive_recording_trigger reads a trigger's definition
-- (pg_get_triggerdef), which fails for a trigger whose table another
-- session is dropping: it must only ever see the triggers of part's tree.
-- OFFSET 0 keeps the planner from pushing it down to a scan of every
-- trigger of the database, and its cost makes the planner test a trigger's
-- table before it, wherever both are quals of one scan.
ALTER FUNCTION idempotency_archive_recording_trigger(oid) COST 10000;

CREATE OR REPLACE FUNCTION idempotency_archive_vouch_partition_triggers(part oid) RETURNS void
    LANGUAGE sql AS $$
DELETE FROM idempotency_archive_recorded_partition_triggers r
 WHERE r.partition IN (SELECT t.relid FROM pg_partition_tree(part) t)
    OR NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger g WHERE g.oid = r.trigger);
INSERT INTO idempotency_archive_recorded_partition_triggers (trigger, written, partition)
SELECT s.oid, s.xmin, s.tgrelid
  FROM (SELECT g.oid, g.xmin, g.tgrelid
          FROM pg_partition_tree(part) t
          JOIN pg_catalog.pg_trigger g ON g.tgrelid = t.relid
        OFFSET 0) AS s
 WHERE idempotency_archive_recording_trigger(s.oid) IS NOT NULL;
$$;

-- idempotency_archive_mark_moved_rows(part): before adopting part again,
-- marks every expiry pending when part was adopted before and a clone of
-- the archive's row trigger in its tree is not the one vouched for: turned
-- off and on, it may have let a MERGE move rows out of part, unrecorded,
-- into any month (on PostgreSQL 15 a MERGE leaves the statement trigger's
-- transition table empty for a row that changes partition). A partition
-- attached by hand and never adopted has had no clone to vouch for: its
-- adoption marks its own bounds, as before.
CREATE OR REPLACE FUNCTION idempotency_archive_mark_moved_rows(part oid) RETURNS void
    LANGUAGE sql AS $$
INSERT INTO idempotency_archive_plain_keys_pending (expired_from, expired_to)
SELECT '-infinity', 'infinity'
 WHERE idempotency_archive_partition_recorded(part)
   AND EXISTS (SELECT 1
                 FROM (SELECT g.oid, g.xmin
                         FROM pg_partition_tree(part) t
                         JOIN pg_catalog.pg_trigger g ON g.tgrelid = t.relid
                        WHERE g.tgname = 'idempotency_key_archive_updated_plain_key'
                       OFFSET 0) AS s
                WHERE NOT EXISTS (SELECT 1 FROM idempotency_archive_recorded_partition_triggers r
                                   WHERE r.trigger = s.oid AND r.written = s.xmin))
ON CONFLICT (expired_from, expired_to) DO UPDATE SET after_key = '', after_expired_at = '-infinity';
$$;

-- The partitions as this migration finds them are trusted, when whole, as
-- migration 013 trusts the attachments it finds.
SELECT idempotency_archive_vouch_partition_triggers(t.relid)
  FROM pg_partition_tree(to_regclass('idempotency_key_archive')) t
 WHERE t.level >= 1
   AND idempotency_archive_partition_triggered(t.relid);

-- As in migration 016, and each of part's recording triggers recorded as it
-- is.
CREATE OR REPLACE FUNCTION idempotency_archive_partition_triggered(part oid) RETURNS boolean
    LANGUAGE sql STABLE AS $$
SELECT (c.relnamespace IS DISTINCT FROM (SELECT a.relnamespace FROM pg_catalog.pg_class a
                                          WHERE a.oid = to_regclass('idempotency_key_archive'))
        OR (SELECT count(DISTINCT idempotency_archive_recording_trigger(g.oid)) FILTER (
                   WHERE g.tgname IN ('idempotency_key_archive_plain_keys', 'idempotency_key_archive_plain_keys_update'))
              FROM pg_catalog.pg_trigger g WHERE g.tgrelid = part) = 2)
       AND (NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger r
                         WHERE r.tgrelid = to_regclass('idempotency_key_archive')
                           AND r.tgname = 'idempotency_key_archive_updated_plain_key')
            OR EXISTS (SELECT 1 FROM pg_catalog.pg_trigger g
                        WHERE g.tgrelid = part
                          AND idempotency_archive_recording_trigger(g.oid) = 'idempotency_key_archive_updated_plain_key'))
       AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger g
                        WHERE g.tgrelid = part
                          AND idempotency_archive_recording_trigger(g.oid) IS NOT NULL
                          AND NOT EXISTS (SELECT 1 FROM idempotency_archive_recorded_partition_triggers r
                                           WHERE r.trigger = g.oid AND r.written = g.xmin))
  FROM pg_catalog.pg_class c
 WHERE c.oid = part
$$;

-- idempotency_archive_vouch_new_clones(): after the archive's triggers are
-- repaired (idempotency_archive_adopt_root), vouches for the clones of its
-- row trigger that this transaction wrote: created with it, or enabled with
-- it, on every partition, under the locks of the whole tree. Only those: a
-- partition's trigger turned off and on again before this transaction stays
-- unvouched, and its partition is adopted again.
CREATE OR REPLACE FUNCTION idempotency_archive_vouch_new_clones() RETURNS void
    LANGUAGE sql AS $$
INSERT INTO idempotency_archive_recorded_partition_triggers (trigger, written, partition)
SELECT g.oid, g.xmin, g.tgrelid
  FROM pg_partition_tree(to_regclass('idempotency_key_archive')) t
  JOIN pg_catalog.pg_trigger g ON g.tgrelid = t.relid
 WHERE t.level >= 1
   AND g.tgname = 'idempotency_key_archive_updated_plain_key'
   AND g.xmin = xid(pg_current_xact_id())
ON CONFLICT (trigger) DO UPDATE SET written = EXCLUDED.written, partition = EXCLUDED.partition;
$$;

-- As in migration 014, for every caller (the manager's attachment of a
-- month, the adoption of a partition): first the rows a clone of the row
-- trigger turned off may have let a MERGE move out of part are marked
-- pending, then, once part's tree has its recording triggers, each enabled,
-- they are vouched for as they are.
CREATE OR REPLACE FUNCTION idempotency_archive_partition_triggers(part regclass) RETURNS void
    LANGUAGE plpgsql AS $$
DECLARE
    archive_ns     oid := (SELECT relnamespace FROM pg_class WHERE oid = to_regclass('idempotency_key_archive'));
    archive_schema name := (SELECT nspname FROM pg_namespace WHERE oid = archive_ns);
    tbl            regclass;
    trg            name;
BEGIN
    PERFORM idempotency_archive_mark_moved_rows(part);
    FOR tbl IN
        SELECT t.relid FROM pg_partition_tree(part) t JOIN pg_class c ON c.oid = t.relid
         WHERE c.relnamespace = archive_ns
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
    FOR tbl, trg IN
        SELECT g.tgrelid::regclass, g.tgname
          FROM pg_partition_tree(part) t JOIN pg_trigger g ON g.tgrelid = t.relid
         WHERE g.tgenabled NOT IN ('O', 'A')
           AND g.tgname IN ('idempotency_key_archive_plain_keys', 'idempotency_key_archive_plain_keys_update',
                            'idempotency_key_archive_updated_plain_key')
    LOOP
        EXECUTE format('ALTER TABLE %s ENABLE TRIGGER %I', tbl, trg);
    END LOOP;
    PERFORM idempotency_archive_vouch_partition_triggers(part);
END
$$;
