-- The archive table's own recording triggers, watched and repaired like its
-- partitions'.
--
-- What broke: a sweep inserts through idempotency_key_archive itself, and
-- PostgreSQL then fires that table's statement triggers, not those of the
-- partitions the rows land in. Migrations 012 and 013 check and repair the
-- partitions' triggers only: with the archive's own disabled (an owner's
-- ALTER TABLE idempotency_key_archive DISABLE TRIGGER ALL for a bulk load,
-- left so), set to ENABLE REPLICA, or dropped, every key without a timestamp
-- swept afterwards went unrecorded, its lookups answered not found (a late
-- retry ran again), and the partition manager, archivectl verify and the
-- recorded check all reported the archive clean. Dropping the archive's row
-- trigger dropped its clones too, and the partitions' check stopped asking
-- for them.
--
-- idempotency_archive_root_triggered(): the archive carries its three
-- recording triggers, each of its kind (the statement triggers after INSERT
-- and after UPDATE with their transition table, the row trigger before
-- UPDATE), on its function, enabled for ordinary sessions ('O', or 'A'
-- always).
CREATE OR REPLACE FUNCTION idempotency_archive_root_triggered() RETURNS boolean
    LANGUAGE sql STABLE AS $$
SELECT count(*) = 3
  FROM pg_catalog.pg_trigger g
  JOIN pg_catalog.pg_class c ON c.oid = g.tgrelid
  JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
  JOIN pg_catalog.pg_proc p ON p.oid = g.tgfoid AND p.pronamespace = n.oid
 WHERE g.tgrelid = to_regclass('idempotency_key_archive')
   AND g.tgenabled IN ('O', 'A')
   AND ((g.tgname = 'idempotency_key_archive_plain_keys' AND g.tgtype = 4 -- AFTER INSERT, per statement
         AND g.tgnewtable IS NOT NULL AND p.proname = 'idempotency_index_plain_keys')
     OR (g.tgname = 'idempotency_key_archive_plain_keys_update' AND g.tgtype = 16 -- AFTER UPDATE, per statement
         AND g.tgnewtable IS NOT NULL AND p.proname = 'idempotency_index_plain_keys')
     OR (g.tgname = 'idempotency_key_archive_updated_plain_key' AND g.tgtype = 19 -- BEFORE UPDATE, per row
         AND p.proname = 'idempotency_index_updated_plain_key'))
$$;

-- idempotency_archive_adopt_root(): NULL when the archive's triggers are
-- whole; else marks every expiry pending (rows swept while one did not fire
-- lie in any month, unrecorded: lookups read them in full until the manager
-- has recorded them), creates the triggers that are missing and enables
-- those that are not, and returns ''. A trigger of one of their names that
-- is not one (another kind or function) is not replaced (DROP TRIGGER
-- takes an ACCESS EXCLUSIVE lock, which would stop lookups): the text
-- returned says so, and the run reports it. CREATE TRIGGER takes SHARE ROW
-- EXCLUSIVE on the archive and on every partition the row trigger is cloned
-- to: taken all together without waiting, every 50 ms for up to 5 s, as
-- migration 013 does (lookups go on; archive inserts wait to the commit); a
-- tree never free raises lock_not_available, having done nothing.
CREATE OR REPLACE FUNCTION idempotency_archive_adopt_root() RETURNS text
    LANGUAGE plpgsql AS $$
DECLARE
    archive        regclass := to_regclass('idempotency_key_archive');
    archive_schema name := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                             WHERE c.oid = to_regclass('idempotency_key_archive'));
    part           regclass;
    trg            name;
    locked         boolean := false;
BEGIN
    IF idempotency_archive_root_triggered() THEN
        RETURN NULL;
    END IF;
    FOR attempt IN 1..100 LOOP
        BEGIN
            FOR part IN SELECT t.relid FROM pg_partition_tree(archive) t ORDER BY t.level LOOP
                EXECUTE format('LOCK TABLE %s IN SHARE ROW EXCLUSIVE MODE NOWAIT', part);
            END LOOP;
            locked := true;
            EXIT;
        EXCEPTION WHEN lock_not_available THEN
            PERFORM pg_sleep(0.05);
        END;
    END LOOP;
    IF NOT locked THEN
        RAISE EXCEPTION 'the archive''s recording triggers are not all enabled, and its partitions were never all free of writers for 5 s to repair them: rows swept meanwhile are not found by lookups of keys without a timestamp; run partitions again'
            USING ERRCODE = 'lock_not_available';
    END IF;
    IF idempotency_archive_root_triggered() THEN
        RETURN NULL; -- repaired meanwhile
    END IF;
    -- Pending before anything else: the rows are read in full from here.
    IF EXISTS (SELECT 1 FROM idempotency_key_archive) THEN
        INSERT INTO idempotency_archive_plain_keys_pending (expired_from, expired_to)
        VALUES ('-infinity', 'infinity')
        ON CONFLICT (expired_from, expired_to) DO UPDATE SET after_key = '', after_expired_at = '-infinity';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = archive AND tgname = 'idempotency_key_archive_plain_keys') THEN
        EXECUTE format('CREATE TRIGGER idempotency_key_archive_plain_keys AFTER INSERT ON %s
                        REFERENCING NEW TABLE AS archived_rows FOR EACH STATEMENT
                        EXECUTE FUNCTION %I.idempotency_index_plain_keys()', archive, archive_schema);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = archive AND tgname = 'idempotency_key_archive_plain_keys_update') THEN
        EXECUTE format('CREATE TRIGGER idempotency_key_archive_plain_keys_update AFTER UPDATE ON %s
                        REFERENCING NEW TABLE AS archived_rows FOR EACH STATEMENT
                        EXECUTE FUNCTION %I.idempotency_index_plain_keys()', archive, archive_schema);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = archive AND tgname = 'idempotency_key_archive_updated_plain_key') THEN
        EXECUTE format('CREATE TRIGGER idempotency_key_archive_updated_plain_key BEFORE UPDATE ON %s
                        FOR EACH ROW
                        WHEN (OLD.scoped_key IS DISTINCT FROM NEW.scoped_key OR OLD.expired_at IS DISTINCT FROM NEW.expired_at)
                        EXECUTE FUNCTION %I.idempotency_index_updated_plain_key()', archive, archive_schema);
    END IF;
    FOR trg IN
        SELECT g.tgname FROM pg_trigger g
         WHERE g.tgrelid = archive AND g.tgenabled NOT IN ('O', 'A')
           AND g.tgname IN ('idempotency_key_archive_plain_keys', 'idempotency_key_archive_plain_keys_update',
                            'idempotency_key_archive_updated_plain_key')
    LOOP
        EXECUTE format('ALTER TABLE %s ENABLE TRIGGER %I', archive, trg);
    END LOOP;
    IF NOT idempotency_archive_root_triggered() THEN
        RETURN 'a trigger on idempotency_key_archive has the name of one of its recording triggers but another definition; '
            || 'drop it (DROP TRIGGER ... ON idempotency_key_archive) and run partitions again, which recreates it';
    END IF;
    RETURN '';
END
$$;
