-- Least-privilege group roles (NOLOGIN). Grant them to login roles:
--   GRANT idempotency_sweeper TO sweeper_login;
--   GRANT idempotency_reader  TO lookup_login;
--   GRANT idempotency_writer  TO api_login;      -- the Postgres live store
--   GRANT idempotency_owner   TO ddl_login;      -- migrations and partitions
-- Safe to re-run: every statement is idempotent. Runs in the schema the
-- setting idemarchive.schema names (ensureRoles sets it), else the current
-- one, with search_path set to pg_catalog alone for the rest of the
-- transaction: it runs as the migrating user, and idempotency_owner may
-- create functions and operators in the archive's schema, where a
-- better-matching overload (format(text, text)) would run with the migrating
-- user's privileges. Every name is resolved in pg_catalog, and the archive's
-- objects are named with their schema.
DO $roles$
DECLARE
    target_schema text := pg_catalog.current_setting('idemarchive.schema', true);
    role_name text;
    part_name text;
    part_owner text;
    may_alter boolean;
    func_sig  text;
BEGIN
    IF target_schema IS NULL OR pg_catalog.texteq(target_schema, '') THEN
        target_schema := pg_catalog.current_schema();
    END IF;
    PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
    FOREACH role_name IN ARRAY ARRAY['idempotency_owner', 'idempotency_sweeper', 'idempotency_reader', 'idempotency_writer'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = role_name) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', role_name);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL; -- created concurrently by another migrator
            END;
        END IF;
    END LOOP;

    -- The owner runs DDL (partitions). The migrating user becomes a member, with
    -- the owner's privileges, so it keeps the right to attach, detach and drop
    -- partitions.
    --
    -- Since PostgreSQL 16 a role's creator (CREATEROLE, no superuser: the RDS
    -- master user) is made a member with ADMIN alone, neither INHERIT nor SET,
    -- and ALTER ... OWNER TO a role needs SET on it: the migrating user grants
    -- itself both, as the role's admin. Only a superuser or a holder of a
    -- role's ADMIN OPTION may grant it since 16 (CREATEROLE no longer
    -- suffices): a migrating user that did not create the role (it was made
    -- by hand, by another user) and lacks them is told what to run. One that
    -- holds them already (granted by hand, or before an upgrade from 15) is
    -- granted nothing, and needs no ADMIN. Before 16 neither option nor the
    -- SET privilege type exists, and CREATEROLE may grant any role.
    IF pg_catalog.current_setting('server_version_num')::int >= 160000 THEN
        IF NOT pg_has_role(current_user, 'idempotency_owner', 'USAGE')
           OR NOT pg_has_role(current_user, 'idempotency_owner', 'SET') THEN
            BEGIN
                IF NOT pg_has_role(current_user, 'idempotency_owner', 'MEMBER WITH ADMIN OPTION') THEN
                    RAISE insufficient_privilege;
                END IF;
                EXECUTE format('GRANT idempotency_owner TO %I WITH INHERIT TRUE, SET TRUE', current_user);
            EXCEPTION WHEN insufficient_privilege OR internal_error THEN
                -- internal_error: "no possible grantors", ADMIN held only
                -- through a membership whose privileges it does not inherit.
                RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege', MESSAGE = format(
                    'the migrating user %1$s needs role idempotency_owner and may not grant it: since PostgreSQL 16 only a superuser '
                    'or a holder of a role''s ADMIN OPTION may grant it (its creator holds it; CREATEROLE no longer suffices), and the '
                    'migrating user did not create these roles on PostgreSQL 16 or later (another user did, or they predate an upgrade from 15); '
                    'as a superuser or a holder of their ADMIN OPTION, give it what their creator holds: '
                    'GRANT idempotency_owner, idempotency_sweeper, idempotency_reader, idempotency_writer TO %1$s WITH ADMIN TRUE, INHERIT FALSE, SET FALSE',
                    quote_ident(current_user));
            END;
        END IF;
    ELSIF NOT pg_has_role(current_user, 'idempotency_owner', 'MEMBER') THEN
        EXECUTE format('GRANT idempotency_owner TO %I', current_user);
    END IF;
    -- The owner creates partitions, and a new owner must have CREATE on the
    -- table's schema for ALTER ... OWNER TO it (checked for every migrating
    -- user but a superuser: the RDS master user included). Since
    -- PostgreSQL 15 the public schema grants CREATE to no one but its owner.
    EXECUTE format('GRANT USAGE, CREATE ON SCHEMA %I TO idempotency_owner', target_schema);
    -- Only where the owner is not right yet: ALTER ... OWNER takes an ACCESS
    -- EXCLUSIVE lock even when nothing changes, and this runs on every
    -- deploy, beside lookups and sweeps. ALTER TABLE ... OWNER does not
    -- cascade to partitions that already exist, so they are listed too.
    -- A partition made or restored by hand as a role whose privileges the
    -- migrating user lacks (it is no superuser on RDS) cannot be given
    -- back from here: it is left with a warning, for its owner or a
    -- superuser to give back (the partitions run names it), rather than
    -- failing every deploy. The archive's own tables are always given
    -- back, or the migration fails. tern's version table is the owner's
    -- too: a member of the owner role applies the migrations.
    FOR part_name, part_owner, may_alter IN
        SELECT c.relname, c.relowner::regrole::text, NOT part.is_partition OR pg_has_role(c.relowner, 'USAGE')
          FROM pg_class c
          JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = target_schema
         CROSS JOIN LATERAL (SELECT c.oid IN (SELECT inhrelid FROM pg_inherits
                                               WHERE inhparent = format('%I.idempotency_key_archive', target_schema)::regclass)
                             AS is_partition) part
         WHERE c.relowner <> 'idempotency_owner'::regrole
           AND (c.relname IN ('idempotency_keys', 'idempotency_key_archive', 'idempotency_writers',
                              'idempotency_archive_schema_version',
                              'idempotency_archive_plain_keys', 'idempotency_archive_plain_keys_pending',
                              'idempotency_archive_late_keys_pending', 'idempotency_archive_recorded_partitions',
                              'idempotency_archive_recorded_triggers', 'idempotency_archive_recorded_partition_triggers')
                OR part.is_partition)
           AND c.relkind IN ('r', 'p')
    LOOP
        IF may_alter THEN
            EXECUTE format('ALTER TABLE %I.%I OWNER TO idempotency_owner', target_schema, part_name);
        ELSE
            RAISE WARNING 'partition %.% is owned by %, whose privileges % lacks: left as it is; give it back as its owner or a superuser with ALTER TABLE ... OWNER TO idempotency_owner',
                quote_ident(target_schema), quote_ident(part_name), part_owner, current_user;
        END IF;
    END LOOP;
    FOR func_sig IN
        SELECT format('%I.%I(%s)', n.nspname, p.proname, pg_get_function_identity_arguments(p.oid))
          FROM pg_proc p
          JOIN pg_namespace n ON n.oid = p.pronamespace AND n.nspname = target_schema
         WHERE p.proname IN ('idempotency_record_unbounded_writer', 'idempotency_index_plain_keys',
                             'idempotency_key_has_time', 'idempotency_key_hash', 'idempotency_key_prompt_span',
                             'idempotency_key_time_bound', 'idempotency_key_late_bound', 'idempotency_key_time_before',
                             'idempotency_key_expiry_hour', 'idempotency_copy_pending_range',
                             'idempotency_archive_adopt_partition', 'idempotency_archive_partition_triggers',
                             'idempotency_archive_partition_recorded', 'idempotency_archive_partition_triggered',
                             'idempotency_index_updated_plain_key', 'idempotency_archive_root_triggered',
                             'idempotency_archive_adopt_root', 'idempotency_archive_recording_trigger',
                             'idempotency_archive_vouch_triggers', 'idempotency_archive_vouch_partition_triggers',
                             'idempotency_archive_mark_moved_rows', 'idempotency_archive_vouch_new_clones',
                             'idempotency_writers_only_grow')
           AND p.proowner <> 'idempotency_owner'::regrole
    LOOP
        EXECUTE format('ALTER FUNCTION %s OWNER TO idempotency_owner', func_sig);
    END LOOP;
    -- The trigger functions run as the owner and act on the schema of the
    -- table that fired them: only the owner may attach them (migration 019;
    -- again here, for those a later migration creates).
    FOR func_sig IN
        SELECT p.oid::regprocedure::text
          FROM pg_proc p
          JOIN pg_namespace n ON n.oid = p.pronamespace AND n.nspname = target_schema
         WHERE p.prorettype = 'pg_catalog.trigger'::regtype
           AND has_function_privilege('public', p.oid, 'EXECUTE')
    LOOP
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', func_sig);
    END LOOP;
    -- The functions that run as the owner search pg_temp last (migration
    -- 020; again here, for those a later migration creates): a search_path
    -- that does not name it searches it first for types and tables.
    FOR func_sig IN
        SELECT p.oid::regprocedure::text
          FROM pg_proc p
          JOIN pg_namespace n ON n.oid = p.pronamespace AND n.nspname = target_schema
         WHERE p.prosecdef
           AND NOT coalesce('search_path=pg_catalog, pg_temp' = ANY (p.proconfig), false)
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = pg_catalog, pg_temp', func_sig);
    END LOOP;

    EXECUTE format('GRANT USAGE ON SCHEMA %I TO idempotency_owner, idempotency_sweeper, idempotency_reader, idempotency_writer', target_schema);

    -- The sweeper reads and deletes live rows and inserts archive rows. PostgreSQL
    -- requires UPDATE on at least one column for SELECT ... FOR UPDATE SKIP LOCKED,
    -- so it gets UPDATE on the single column expires_at; it never issues UPDATE.
    EXECUTE format('REVOKE ALL ON TABLE %1$I.idempotency_keys, %1$I.idempotency_key_archive, %1$I.idempotency_writers, '
                   '%1$I.idempotency_archive_plain_keys, %1$I.idempotency_archive_plain_keys_pending, '
                   '%1$I.idempotency_archive_late_keys_pending, %1$I.idempotency_archive_recorded_partitions, '
                   '%1$I.idempotency_archive_recorded_triggers, %1$I.idempotency_archive_recorded_partition_triggers '
                   'FROM idempotency_sweeper, idempotency_reader, idempotency_writer', target_schema);
    EXECUTE format('GRANT SELECT, DELETE ON TABLE %I.idempotency_keys TO idempotency_sweeper', target_schema);
    EXECUTE format('GRANT UPDATE (expires_at) ON TABLE %I.idempotency_keys TO idempotency_sweeper', target_schema);
    EXECUTE format('GRANT INSERT ON TABLE %I.idempotency_key_archive TO idempotency_sweeper', target_schema);
    -- INSERT ... ON CONFLICT needs SELECT on the conflict target's columns.
    EXECUTE format('GRANT SELECT (scoped_key, expired_at) ON TABLE %I.idempotency_key_archive TO idempotency_sweeper', target_schema);
    -- The Redis live store writes archive rows through a pool with this
    -- role, and records itself in idempotency_writers (ttl_ms = 0) first.
    EXECUTE format('GRANT SELECT, INSERT ON TABLE %I.idempotency_writers TO idempotency_sweeper', target_schema);
    EXECUTE format('GRANT UPDATE (first_used, used_until) ON TABLE %I.idempotency_writers TO idempotency_sweeper', target_schema);

    -- Lookups only read the archive, and the writers' skews that bound how
    -- far back a key's rows can lie.
    EXECUTE format('GRANT SELECT ON TABLE %I.idempotency_key_archive TO idempotency_reader', target_schema);
    EXECUTE format('GRANT SELECT ON TABLE %I.idempotency_writers TO idempotency_reader', target_schema);
    -- Where the rows of keys without a timestamp, and of keys used long after
    -- their timestamp, are (written only by the archive's trigger, as the
    -- owner).
    EXECUTE format('GRANT SELECT ON TABLE %1$I.idempotency_archive_plain_keys, %1$I.idempotency_archive_plain_keys_pending, '
                   '%1$I.idempotency_archive_late_keys_pending TO idempotency_reader',
                   target_schema);

    -- API services (the Postgres live store) register, complete and release
    -- live keys, and hold leases on their (TTL, skew) in idempotency_writers.
    -- They never delete a writer row, nor change what it bounds: the rows
    -- are the proof the skip rests on. (A lease only ever moves first_used
    -- earlier and used_until later.)
    EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE %I.idempotency_keys TO idempotency_writer', target_schema);
    EXECUTE format('GRANT SELECT, INSERT ON TABLE %I.idempotency_writers TO idempotency_writer', target_schema);
    EXECUTE format('GRANT UPDATE (first_used, used_until) ON TABLE %I.idempotency_writers TO idempotency_writer', target_schema);
END
$roles$;
