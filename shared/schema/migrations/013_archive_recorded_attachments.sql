-- idempotency_archive_recorded_partitions (migration 012) records an
-- attachment, not a table: the partition's OID with the xmin of its
-- pg_inherits row, so that a table detached and attached again by hand is
-- adopted again.
--
-- What broke (the invariant of migration 012: every attached partition the
-- registry vouches for has its rows recorded or in a pending range): the
-- registry held OIDs only. A table detached by hand during a partitions
-- run, after the run's adoption and before its plain-key maintenance, lost
-- its records (the prune deletes the records of months no table holds) or
-- had its pending range finished without its rows (the indexing reads a
-- range through the archive, which no longer held them). Attached again by
-- hand before the next run, its OID was still recorded: it was never
-- adopted again, its rows stayed unrecorded, and lookups of keys without a
-- timestamp answered not found for keys that ran.
--
-- An attachment is one pg_inherits row. ATTACH PARTITION inserts one; DETACH
-- deletes it, and DETACH ... CONCURRENTLY first rewrites it (the pending
-- mark) and then deletes it: every detach ends the attachment, and a table
-- attached again has a row with another xmin (the transaction that attached
-- it). Freezing keeps a row's xmin (PostgreSQL 9.4 and later), so an
-- attachment's xmin does not change while it lasts. A registry row vouches
-- only for the attachment whose xmin it holds
-- (idempotency_archive_partition_recorded): whatever a run's prune or
-- indexing did while a table was detached, its next attachment is
-- unrecorded until a run adopts it, which marks its bounds pending again. So
-- the order of the run's steps, and the snapshots they read, no longer
-- matter to the invariant. (A restore of the whole database, pg_upgrade
-- included, writes new pg_inherits rows: every partition is adopted again,
-- and its rows read again, once.)
--
-- The registry's rows are taken to vouch for the attachments current when
-- this migration runs, as migration 012 took the partitions then attached:
-- a table already detached and attached again by hand before it ran can be
-- made to be adopted by detaching and attaching it once more.
ALTER TABLE idempotency_archive_recorded_partitions ADD COLUMN IF NOT EXISTS attached xid;

UPDATE idempotency_archive_recorded_partitions r
   SET attached = i.xmin
  FROM pg_inherits i
 WHERE i.inhrelid = r.partition
   AND r.attached IS NULL
   AND NOT i.inhdetachpending
   AND r.partition IN (SELECT t.relid FROM pg_partition_tree(to_regclass('idempotency_key_archive')) t WHERE t.level >= 1);

-- idempotency_archive_partition_recorded(part): the registry vouches for
-- part's current attachment (a row with part's OID and the xmin of its
-- pg_inherits row). A row without an attachment (NULL: written by a
-- partition manager from before this migration, during a deploy or after a
-- rollback) vouches for none: that partition is adopted again, harmlessly.
CREATE OR REPLACE FUNCTION idempotency_archive_partition_recorded(part oid) RETURNS boolean
    LANGUAGE sql STABLE AS $$
SELECT EXISTS (SELECT 1
                 FROM idempotency_archive_recorded_partitions r
                 JOIN pg_catalog.pg_inherits i ON i.inhrelid = r.partition AND i.xmin = r.attached
                WHERE r.partition = part)
$$;

-- idempotency_archive_partition_triggered(part): part carries the archive's
-- recording triggers, each enabled for ordinary sessions (tgenabled 'O',
-- or 'A' always; 'D' disabled and 'R' replica-only fire in no ordinary
-- session): the two statement triggers, unless part lies outside the
-- archive's schema (where it can carry none; see migration 012), and the
-- clone of the archive's BEFORE UPDATE row trigger (below), wherever part
-- lies, once that trigger exists. A partition that lacks one (dropped,
-- disabled or set to ENABLE REPLICA by hand, a pg_restore
-- --disable-triggers that failed half-way) may hold rows written into it, or
-- moved out of it, that no trigger recorded: it counts as unadopted, and its
-- adoption marks its bounds pending and enables the triggers again.
CREATE OR REPLACE FUNCTION idempotency_archive_partition_triggered(part oid) RETURNS boolean
    LANGUAGE sql STABLE AS $$
SELECT (c.relnamespace IS DISTINCT FROM (SELECT a.relnamespace FROM pg_catalog.pg_class a
                                          WHERE a.oid = to_regclass('idempotency_key_archive'))
        OR (SELECT count(*) FROM pg_catalog.pg_trigger g
             WHERE g.tgrelid = part AND g.tgenabled IN ('O', 'A')
               AND g.tgname IN ('idempotency_key_archive_plain_keys', 'idempotency_key_archive_plain_keys_update')) = 2)
       AND (NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger r
                         WHERE r.tgrelid = to_regclass('idempotency_key_archive')
                           AND r.tgname = 'idempotency_key_archive_updated_plain_key')
            OR EXISTS (SELECT 1 FROM pg_catalog.pg_trigger g
                        WHERE g.tgrelid = part AND g.tgenabled IN ('O', 'A')
                          AND g.tgname = 'idempotency_key_archive_updated_plain_key'))
  FROM pg_catalog.pg_class c
 WHERE c.oid = part
$$;

-- As in migration 012, and enables a recording trigger that is disabled or
-- replica-only (ALTER TABLE ... ENABLE TRIGGER takes the same SHARE ROW
-- EXCLUSIVE lock as CREATE TRIGGER): idempotency_archive_partition_triggered
-- counts only triggers that fire in ordinary sessions.
CREATE OR REPLACE FUNCTION idempotency_archive_partition_triggers(part regclass) RETURNS void
    LANGUAGE plpgsql AS $$
DECLARE
    archive_schema name := (SELECT relnamespace::regnamespace::name FROM pg_class
                             WHERE oid = to_regclass('idempotency_key_archive'));
    tbl            regclass;
    trg            name;
BEGIN
    FOR tbl IN
        SELECT t.relid FROM pg_partition_tree(part) t JOIN pg_class c ON c.oid = t.relid
         WHERE c.relnamespace::regnamespace::name = archive_schema
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
    -- Every recording trigger of the tree not enabled for ordinary sessions
    -- (disabled, or replica-only), the clones of the archive's row trigger
    -- in any schema included, is enabled again.
    FOR tbl, trg IN
        SELECT g.tgrelid::regclass, g.tgname
          FROM pg_partition_tree(part) t JOIN pg_trigger g ON g.tgrelid = t.relid
         WHERE g.tgenabled NOT IN ('O', 'A')
           AND g.tgname IN ('idempotency_key_archive_plain_keys', 'idempotency_key_archive_plain_keys_update',
                            'idempotency_key_archive_updated_plain_key')
    LOOP
        EXECUTE format('ALTER TABLE %s ENABLE TRIGGER %I', tbl, trg);
    END LOOP;
END
$$;

-- As in migration 012, with two changes:
--   - A partition is adopted unless the registry vouches for its current
--     attachment and it carries the recording triggers (above), and the
--     registry records each table of its tree with the xmin of its
--     attachment, replacing what it held for an earlier one.
--   - A partition its writers never left free for 5 s raises
--     lock_not_available instead of returning NULL, so that the run reports
--     it (its rows are not found by every lookup until a run adopts it)
--     rather than look clean. Nothing was done: the lock was never held.
-- It still returns NULL, having done nothing, when part is covered already or
-- no longer attached; '' when it adopted part; the error's text when part
-- could not be given the triggers (its rows are then marked pending, and it
-- is not recorded).
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
    IF idempotency_archive_partition_recorded(part) AND idempotency_archive_partition_triggered(part) THEN
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
        RAISE EXCEPTION 'partition % attached by hand was never free of writers for 5 s: not adopted, its rows are not found by every lookup until a run adopts it',
            part::regclass
            USING ERRCODE = 'lock_not_available';
    END IF;
    -- Still in the archive's tree, by attachments none of which is a
    -- pending detach (read after the lock: no DETACH or ATTACH of part can
    -- be under way now, so the attachment recorded below is the one whose
    -- rows the pending mark covers), and its month.
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
    -- A table of part's tree whose clone of the archive's row trigger does
    -- not fire may have let a MERGE move rows out of it unrecorded, into any
    -- month: every expiry is pending then (rare: an owner disabled it).
    IF EXISTS (SELECT 1 FROM pg_trigger r WHERE r.tgrelid = archive AND r.tgname = 'idempotency_key_archive_updated_plain_key')
       AND EXISTS (SELECT 1 FROM pg_partition_tree(part) t
                    WHERE NOT EXISTS (SELECT 1 FROM pg_trigger g
                                       WHERE g.tgrelid = t.relid AND g.tgenabled IN ('O', 'A')
                                         AND g.tgname = 'idempotency_key_archive_updated_plain_key')) THEN
        lo := '-infinity';
        hi := 'infinity';
        has_rows := true;
    END IF;
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
    INSERT INTO idempotency_archive_recorded_partitions (partition, attached)
    SELECT t.relid, i.xmin
      FROM pg_partition_tree(part) t
      JOIN pg_inherits i ON i.inhrelid = t.relid
    ON CONFLICT (partition) DO UPDATE SET attached = EXCLUDED.attached;
    RETURN '';
END
$$;

-- Rows a MERGE moves to another month are recorded too.
--
-- An UPDATE that changes a row's expiry to another month moves the row to
-- another partition. The archive's AFTER UPDATE statement trigger
-- (migration 006) records a plain UPDATE's moved rows from its transition
-- table; on PostgreSQL 15 a MERGE ... WHEN MATCHED THEN UPDATE that moves a
-- row leaves that table empty, so the row's new expiry was never recorded,
-- and a lookup of a key without a timestamp read only the month the row had
-- left: not found. No statement trigger sees the moved row (PostgreSQL fires
-- none of the destination partition's, nor any INSERT or DELETE one), but
-- the source partition's BEFORE UPDATE row triggers fire for it, with its
-- new values, whichever statement moves it.
--
-- So a BEFORE UPDATE row trigger on the archive, which PostgreSQL clones to
-- every partition, those attached later (by the manager or by hand) too,
-- records the new row by the rule of the statement trigger (migration 010;
-- like the plain-key indexing, with the bound of the row's expiry hour, so
-- it may record a row up to an hour less late than the rule asks for,
-- which costs space, never a row). It records in the statement that
-- writes the row: a statement that fails takes its records with it, and a
-- row another trigger later skips only leaves a record that sends lookups
-- to a month they find nothing in. Its WHEN clause keeps it to updates of
-- the key or the expiry (an owner's repair): sweeps and completions only
-- insert, and pay nothing. A row whose statement trigger sees it too is
-- recorded twice, once (ON CONFLICT DO NOTHING). It records into the tables
-- beside the archive (the root of the partition it fires on), so that it
-- records rows of a partition in another schema too.
CREATE OR REPLACE FUNCTION idempotency_index_updated_plain_key() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    archive_schema name := (SELECT c.relnamespace::regnamespace::name FROM pg_class c
                             WHERE c.oid = pg_partition_root(TG_RELID));
BEGIN
    EXECUTE format(
        'INSERT INTO %1$I.idempotency_archive_plain_keys (key_hash, expired_at)
         SELECT %1$I.idempotency_key_hash($1), $2
           FROM (SELECT %1$I.idempotency_key_late_bound(%1$I.idempotency_key_expiry_hour($2),
                                                        %1$I.idempotency_key_prompt_span() - interval ''1 hour'')) AS t (b)
          WHERE NOT %1$I.idempotency_key_has_time($1)
             OR %1$I.idempotency_key_time_before($1, %1$I.idempotency_key_time_bound(b, true), %1$I.idempotency_key_time_bound(b, false))
         ON CONFLICT DO NOTHING', archive_schema)
        USING NEW.scoped_key, NEW.expired_at;
    RETURN NEW;
END
$$;

-- CREATE TRIGGER on the archive takes SHARE ROW EXCLUSIVE on it and on every
-- partition: taken all together without waiting, every 50 ms for up to two
-- minutes, giving them all back when one is not free, as migration 012 does
-- (lookups go on; archive inserts wait milliseconds, to the commit).
DO $$
DECLARE
    part regclass;
BEGIN
    IF EXISTS (SELECT 1 FROM pg_trigger
                WHERE tgrelid = to_regclass('idempotency_key_archive') AND tgname = 'idempotency_key_archive_updated_plain_key') THEN
        RETURN;
    END IF;
    FOR attempt IN 1..2400 LOOP
        BEGIN
            FOR part IN
                SELECT t.relid FROM pg_partition_tree(to_regclass('idempotency_key_archive')) t ORDER BY t.level
            LOOP
                EXECUTE format('LOCK TABLE %s IN SHARE ROW EXCLUSIVE MODE NOWAIT', part);
            END LOOP;
            EXIT;
        EXCEPTION WHEN lock_not_available THEN
            IF attempt = 2400 THEN
                RAISE EXCEPTION 'migration 013: the archive''s partitions were never all free of writers at once for two minutes; run the migration again'
                    USING ERRCODE = 'lock_not_available';
            END IF;
            PERFORM pg_sleep(0.05);
        END;
    END LOOP;
    CREATE TRIGGER idempotency_key_archive_updated_plain_key BEFORE UPDATE ON idempotency_key_archive
        FOR EACH ROW
        WHEN (OLD.scoped_key IS DISTINCT FROM NEW.scoped_key OR OLD.expired_at IS DISTINCT FROM NEW.expired_at)
        EXECUTE FUNCTION idempotency_index_updated_plain_key();
END
$$;
