-- Migrations 012 and 013's functions, for a schema whose name needs
-- quoting (upper case, a space, a dot, a quote: "Archive", "idem archive").
--
-- What broke: they read the archive's schema as relnamespace::regnamespace::name,
-- and regnamespace's text is the name quoted as an identifier ("Archive",
-- quotes included), which format('%I') then quoted again: """Archive""", a
-- schema that does not exist. Every partition the partition manager created
-- or adopted failed (CREATE TRIGGER ... EXECUTE FUNCTION """Archive"""...),
-- and an owner's UPDATE that moved an archive row failed in the row trigger.
--
-- The invariant: a schema name is written into SQL only by format('%I') of
-- the name itself (pg_namespace.nspname), never of a text that is already
-- an identifier. Tables are compared by their namespace's OID. The bodies
-- are migration 013's otherwise. Migration 012's function was edited after
-- release to the same effect: an upgrade from before it, in such a schema
-- and with partitions, failed in its last statement. The edit changes
-- nothing for a schema whose name needs no quoting (the two texts are equal
-- there), and migration 013 replaces that function in the same run.
CREATE OR REPLACE FUNCTION idempotency_archive_partition_triggers(part regclass) RETURNS void
    LANGUAGE plpgsql AS $$
DECLARE
    archive_ns     oid := (SELECT relnamespace FROM pg_class WHERE oid = to_regclass('idempotency_key_archive'));
    archive_schema name := (SELECT nspname FROM pg_namespace WHERE oid = archive_ns);
    tbl            regclass;
    trg            name;
BEGIN
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
END
$$;

CREATE OR REPLACE FUNCTION idempotency_index_updated_plain_key() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    archive_schema name := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
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
