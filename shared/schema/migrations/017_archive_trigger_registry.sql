-- The archive's own recording triggers are vouched for by a registry, so
-- that turning them off and on again between two partitions runs is seen.
--
-- What broke: migration 015's checks read the triggers as they are at the
-- moment of the run. An owner's DISABLE TRIGGER ALL for a bulk load (what
-- pg_restore --data-only --disable-triggers does), then ENABLE TRIGGER ALL,
-- left every key without a timestamp swept in between unrecorded and
-- outside any pending range: answered not found for good, while the run and
-- the recorded check found every trigger whole.
--
-- PostgreSQL writes a trigger's pg_trigger row anew on every DISABLE or
-- ENABLE (a new xmin), and DROP and CREATE give it a new OID. So
-- idempotency_archive_recorded_triggers holds each recording trigger of the
-- archive as the last repair (or this migration) found it whole, by OID and
-- xmin, as migration 013 records each attachment; the archive's triggers
-- count as whole only while each is recorded so. Any other version of them
-- (turned off and on, dropped and created, a database restored from a dump,
-- a major version upgrade) is repaired by the next partitions run: every
-- expiry is marked pending, then the triggers as they are now are recorded.
CREATE TABLE IF NOT EXISTS idempotency_archive_recorded_triggers (
    trigger oid PRIMARY KEY,
    written xid NOT NULL
);

-- idempotency_archive_vouch_triggers(): records the archive's recording
-- triggers as they are now, in place of what the registry held. Called
-- once every expiry is pending.
CREATE OR REPLACE FUNCTION idempotency_archive_vouch_triggers() RETURNS void
    LANGUAGE sql AS $$
DELETE FROM idempotency_archive_recorded_triggers;
INSERT INTO idempotency_archive_recorded_triggers (trigger, written)
SELECT g.oid, g.xmin FROM pg_catalog.pg_trigger g
 WHERE g.tgrelid = to_regclass('idempotency_key_archive')
   AND idempotency_archive_recording_trigger(g.oid) IS NOT NULL;
$$;

-- The triggers as this migration finds them are trusted, when whole, as
-- migration 013 trusts the attachments it finds (an upgrade then needs no
-- full scan of the archive); when not whole, the next run repairs them.
SELECT idempotency_archive_vouch_triggers() WHERE idempotency_archive_root_triggered();

-- As in migration 016, and each trigger recorded as it is.
CREATE OR REPLACE FUNCTION idempotency_archive_root_triggered() RETURNS boolean
    LANGUAGE sql STABLE AS $$
SELECT count(DISTINCT t.name) = 3 AND coalesce(bool_and(t.vouched), false)
  FROM (SELECT idempotency_archive_recording_trigger(g.oid) AS name,
               EXISTS (SELECT 1 FROM idempotency_archive_recorded_triggers r
                        WHERE r.trigger = g.oid AND r.written = g.xmin) AS vouched
          FROM pg_catalog.pg_trigger g
         WHERE g.tgrelid = to_regclass('idempotency_key_archive')) AS t
 WHERE t.name IS NOT NULL
$$;

-- As in migration 015, vouching for the triggers once every expiry is
-- pending, and without a lock where they are whole but not vouched for.
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
    -- Whole but not vouched for (turned off and on again since the last
    -- run, or a database restored): no DDL is needed, so no lock. The rows
    -- swept while they were off lie anywhere: every expiry is pending
    -- before the triggers are vouched for again as they are now.
    IF (SELECT count(DISTINCT idempotency_archive_recording_trigger(g.oid)) FROM pg_trigger g WHERE g.tgrelid = archive) = 3 THEN
        INSERT INTO idempotency_archive_plain_keys_pending (expired_from, expired_to)
        VALUES ('-infinity', 'infinity')
        ON CONFLICT (expired_from, expired_to) DO UPDATE SET after_key = '', after_expired_at = '-infinity';
        PERFORM idempotency_archive_vouch_triggers();
        RETURN '';
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
    PERFORM idempotency_archive_vouch_triggers();
    IF NOT idempotency_archive_root_triggered() THEN
        RETURN 'a trigger on idempotency_key_archive has the name of one of its recording triggers but another definition; '
            || 'drop it (DROP TRIGGER ... ON idempotency_key_archive) and run partitions again, which recreates it';
    END IF;
    RETURN '';
END
$$;
