-- The recording triggers are checked for what they are, not only for their
-- names.
--
-- What broke: idempotency_archive_partition_triggered (migration 013) read
-- only the partitions' triggers' names and whether they fire, and
-- idempotency_archive_root_triggered (migration 015) did not read a
-- trigger's WHEN clause, arguments or column list. A trigger of a recording
-- trigger's name but another kind (AFTER TRUNCATE), function, or a WHEN
-- (false) passed: the rows it should have recorded went unrecorded, their
-- lookups answered not found, and the partitions run and archivectl verify
-- saw nothing wrong.
--
-- idempotency_archive_recording_trigger(trg): trg's name when trg is one of
-- the archive's recording triggers as the migrations create them, enabled
-- for ordinary sessions ('O', or 'A' always): the statement triggers after
-- INSERT and after UPDATE, with their transition table and no WHEN clause,
-- on idempotency_index_plain_keys; the row trigger before UPDATE (or its
-- clone on a partition), with no WHEN clause or the one it is created with,
-- on idempotency_index_updated_plain_key; each with no arguments and no
-- column list, its function in the archive's schema. NULL otherwise.
CREATE OR REPLACE FUNCTION idempotency_archive_recording_trigger(trg oid) RETURNS name
    LANGUAGE sql STABLE AS $$
SELECT g.tgname
  FROM pg_catalog.pg_trigger g
  JOIN pg_catalog.pg_proc p ON p.oid = g.tgfoid
 WHERE g.oid = trg
   AND g.tgenabled IN ('O', 'A') AND g.tgnargs = 0 AND g.tgattr::text = ''
   AND p.pronamespace = (SELECT c.relnamespace FROM pg_catalog.pg_class c WHERE c.oid = to_regclass('idempotency_key_archive'))
   AND ((g.tgname = 'idempotency_key_archive_plain_keys' AND g.tgtype = 4 -- AFTER INSERT, per statement
         AND g.tgnewtable IS NOT NULL AND g.tgqual IS NULL AND p.proname = 'idempotency_index_plain_keys')
     OR (g.tgname = 'idempotency_key_archive_plain_keys_update' AND g.tgtype = 16 -- AFTER UPDATE, per statement
         AND g.tgnewtable IS NOT NULL AND g.tgqual IS NULL AND p.proname = 'idempotency_index_plain_keys')
     OR (g.tgname = 'idempotency_key_archive_updated_plain_key' AND g.tgtype = 19 -- BEFORE UPDATE, per row
         AND p.proname = 'idempotency_index_updated_plain_key'
         AND (g.tgqual IS NULL
              OR position(' FOR EACH ROW WHEN (((old.scoped_key IS DISTINCT FROM new.scoped_key) OR (old.expired_at IS DISTINCT FROM new.expired_at))) EXECUTE '
                          IN pg_catalog.pg_get_triggerdef(g.oid)) > 0)))
$$;

-- As in migration 015, each trigger held to what it is.
CREATE OR REPLACE FUNCTION idempotency_archive_root_triggered() RETURNS boolean
    LANGUAGE sql STABLE AS $$
SELECT count(DISTINCT idempotency_archive_recording_trigger(g.oid)) = 3
  FROM pg_catalog.pg_trigger g
 WHERE g.tgrelid = to_regclass('idempotency_key_archive')
$$;

-- As in migration 013, each trigger held to what it is. A partition with a
-- trigger of a recording trigger's name that is not one counts as
-- unadopted; its adoption cannot replace it (it creates a trigger only where
-- none of the name exists, and never drops one), so the partitions run
-- reports it as failed until an owner drops it.
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
  FROM pg_catalog.pg_class c
 WHERE c.oid = part
$$;
