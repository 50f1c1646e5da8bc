-- What verify's "tables are as migrate made them" check adds to the shape
-- schema.Mismatches reads: one row per problem, in the migrated schema
-- (current_schema()), and in every schema for the archive's partitions,
-- none where the tables do not exist (a table missing beside the live
-- table is one).
--
-- Why each matters:
--   - The search_path's first schema must be the one holding the tables:
--     the other checks read them through the search_path, this one and
--     migrate read current_schema().
--   - An UNLOGGED table (live, writers, an archive partition in any schema,
--     the plain keys index, the registries) is emptied by a crash: live
--     keys run again, archived keys are forgotten. One with row level
--     security shows its rows only as a policy lets it (none without one):
--     a lookup that cannot see an archived row answers not found.
--   - idempotency_keys_unbounded_writer records a writer that does not
--     bound its keys' timestamps, and idempotency_writers_only_grow keeps
--     that record from shrinking: the archive skip trusts a key's timestamp
--     only while both hold, so without them a late retry can run twice.
--     idempotency_copy_pending_range queues a range the plain keys index
--     must read again. Each is checked by its name, events, columns,
--     condition and function (its source too): a disabled or replica-only one fires for no
--     ordinary session, one of the same name doing something else does not
--     do its work. (The archive's own recording triggers are the recording
--     check's.)
--   - idempotency_keys_expires_at_idx, a btree on (expires_at) alone: every
--     sweep batch reads the oldest expiries through it; without it each
--     batch reads the whole table.
--   - No write, TRUNCATE, REFERENCES or TRIGGER privilege on these tables,
--     nor on any of their columns, for PUBLIC or idempotency_reader
--     (lookups only read), and no CREATE in the schema for them: a reader
--     able to rewrite an archived row changes a late retry's answer; one
--     able to write a registry vouches for a partition whose rows lookups
--     then skip.
WITH archive AS (
    SELECT p.relid
      FROM pg_catalog.pg_partition_tree(pg_catalog.to_regclass(pg_catalog.format('%I.idempotency_key_archive', current_schema()))) p
),
tbl AS (
    SELECT c.oid, c.relname::text AS relname, c.relpersistence, c.relacl, c.oid IN (SELECT relid FROM archive) AS in_archive,
           c.relrowsecurity OR c.relforcerowsecurity AS row_security,
           CASE WHEN n.nspname = current_schema() THEN c.relname::text
                ELSE pg_catalog.format('%I.%I', n.nspname, c.relname) END AS label
      FROM pg_catalog.pg_class c
      JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
     WHERE c.relkind IN ('r', 'p')
       AND ((n.nspname = current_schema()
             AND c.relname IN ('idempotency_keys', 'idempotency_writers', 'idempotency_key_archive',
                               'idempotency_archive_plain_keys', 'idempotency_archive_plain_keys_pending',
                               'idempotency_archive_late_keys_pending', 'idempotency_archive_recorded_partitions',
                               'idempotency_archive_recorded_triggers', 'idempotency_archive_recorded_partition_triggers',
                               'idempotency_archive_schema_version'))
            OR c.oid IN (SELECT relid FROM archive))
),
-- Each as migrate creates it: its table, pg_trigger.tgtype (ROW 1, BEFORE
-- 2, INSERT 4, UPDATE 16), the columns of an UPDATE OF, what
-- pg_get_triggerdef prints from FOR EACH to EXECUTE, and its function: its
-- name, the md5 of its source as the last migration to define it wrote it
-- (a migration that redefines one changes its md5 here: verify's tests of a
-- healthy install fail until it does), and whether it is SECURITY DEFINER.
expected_trigger (relname, tgname, tgtype, columns, body, proname, source_md5, definer) AS (
    VALUES ('idempotency_keys', 'idempotency_keys_unbounded_writer', 7, '{}'::text[],
            'FOR EACH ROW WHEN ((new.skew_ms IS NULL))', 'idempotency_record_unbounded_writer',
            '467de73628c556a4199bd4c8d95e2198', true),
           ('idempotency_writers', 'idempotency_writers_only_grow', 19, '{first_used,used_until}',
            'FOR EACH ROW', 'idempotency_writers_only_grow',
            '15ca81f1b5bb65112debd13ac7296677', false),
           ('idempotency_archive_plain_keys_pending', 'idempotency_copy_pending_range', 21, '{}',
            'FOR EACH ROW WHEN (((new.after_key = ''''::text) AND (new.after_expired_at = ''-infinity''::timestamp with time zone)))',
            'idempotency_copy_pending_range', '3f7421166c07ffe631d532d7cb37d91d', true)
),
trig AS (
    SELECT e.relname, e.tgname, g.tgenabled, t.oid IS NULL AS no_table,
           (g.tgtype = e.tgtype
           AND ARRAY(SELECT a.attname::text FROM pg_catalog.unnest(g.tgattr::int2[]) AS k (attnum)
                       JOIN pg_catalog.pg_attribute a ON a.attrelid = t.oid AND a.attnum = k.attnum
                      ORDER BY a.attname) = e.columns
           AND pg_catalog.substring(pg_catalog.pg_get_triggerdef(g.oid), '(FOR EACH .*) EXECUTE ') = e.body
           AND p.proname = e.proname AND p.pronamespace = (SELECT relnamespace FROM pg_catalog.pg_class WHERE oid = t.oid)
           AND pg_catalog.md5(p.prosrc) = e.source_md5 AND p.prosecdef = e.definer
           AND p.proconfig IS NOT DISTINCT FROM '{"search_path=pg_catalog, pg_temp"}'::text[]) IS TRUE AS same
      FROM expected_trigger e
      LEFT JOIN tbl t ON t.relname = e.relname AND NOT t.in_archive
      LEFT JOIN pg_catalog.pg_trigger g ON g.tgrelid = t.oid AND g.tgname = e.tgname
      LEFT JOIN pg_catalog.pg_proc p ON p.oid = g.tgfoid
     -- A table dropped (a DROP ... CASCADE, a partial restore) takes its
     -- trigger with it: said, where the live table says the schema is
     -- migrated.
     WHERE t.oid IS NOT NULL OR EXISTS (SELECT FROM tbl WHERE relname = 'idempotency_keys' AND NOT in_archive)
),
write_privilege (privilege, by_column) AS (
    VALUES ('INSERT', true), ('UPDATE', true), ('DELETE', false), ('TRUNCATE', false), ('REFERENCES', true), ('TRIGGER', false)
),
reader AS (
    SELECT 'idempotency_reader'::text AS role WHERE pg_catalog.to_regrole('idempotency_reader') IS NOT NULL
)
SELECT pg_catalog.format('the search_path''s first schema is %I, but it reads %s from %I', current_schema(), v.relname, n.nspname)
  FROM (VALUES ('idempotency_keys'), ('idempotency_key_archive')) v (relname)
  JOIN pg_catalog.pg_class c ON c.oid = pg_catalog.to_regclass(v.relname)
  JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname <> current_schema()
UNION ALL
SELECT pg_catalog.format('%s is UNLOGGED: a crash empties it', t.label)
  FROM tbl t
 WHERE t.relpersistence <> 'p'
UNION ALL
SELECT pg_catalog.format('%s has row level security on: lookups and sweeps see only the rows a policy shows them', t.label)
  FROM tbl t
 WHERE t.row_security
UNION ALL
SELECT CASE WHEN g.no_table THEN pg_catalog.format('%s is missing, and its trigger %s with it', g.relname, g.tgname)
            WHEN g.tgenabled IS NULL THEN pg_catalog.format('%s has no trigger %s', g.relname, g.tgname)
            WHEN NOT g.same THEN pg_catalog.format('trigger %s on %s is not the one migrate creates', g.tgname, g.relname)
            ELSE pg_catalog.format('trigger %s on %s is %s', g.tgname, g.relname,
                                   CASE g.tgenabled WHEN 'D' THEN 'disabled' ELSE 'replica-only' END) END
  FROM trig g
 WHERE g.tgenabled IS NULL OR NOT g.same OR g.tgenabled NOT IN ('O', 'A')
UNION ALL
SELECT 'idempotency_keys has no valid btree index idempotency_keys_expires_at_idx on (expires_at) alone'
  FROM tbl t
 WHERE t.relname = 'idempotency_keys' AND NOT t.in_archive
   AND NOT EXISTS (SELECT FROM pg_catalog.pg_index i
                     JOIN pg_catalog.pg_class ic ON ic.oid = i.indexrelid
                     JOIN pg_catalog.pg_am am ON am.oid = ic.relam
                     JOIN pg_catalog.pg_attribute a ON a.attrelid = t.oid AND a.attname = 'expires_at'
                    WHERE i.indrelid = t.oid AND ic.relname = 'idempotency_keys_expires_at_idx'
                      AND i.indisvalid AND i.indisready AND am.amname = 'btree'
                      AND i.indnatts = 1 AND i.indkey[0] = a.attnum AND i.indexprs IS NULL AND i.indpred IS NULL)
UNION ALL
SELECT pg_catalog.format('PUBLIC may %s on %s', a.privilege_type, t.label)
  FROM tbl t CROSS JOIN LATERAL pg_catalog.aclexplode(t.relacl) a
 WHERE a.grantee = 0 AND a.privilege_type IN (SELECT privilege FROM write_privilege)
UNION ALL
SELECT pg_catalog.format('PUBLIC may %s (%s) on %s', a.privilege_type, pg_catalog.string_agg(att.attname::text, ', ' ORDER BY att.attname), t.label)
  FROM tbl t
  JOIN pg_catalog.pg_attribute att ON att.attrelid = t.oid AND att.attnum > 0 AND NOT att.attisdropped
 CROSS JOIN LATERAL pg_catalog.aclexplode(att.attacl) a
 WHERE a.grantee = 0 AND a.privilege_type IN (SELECT privilege FROM write_privilege)
 GROUP BY a.privilege_type, t.label
UNION ALL
SELECT pg_catalog.format('%s may %s on %s', r.role, w.privilege, t.label)
  FROM tbl t CROSS JOIN write_privilege w CROSS JOIN reader r
 WHERE CASE WHEN w.by_column THEN pg_catalog.has_any_column_privilege(r.role, t.oid, w.privilege)
            ELSE pg_catalog.has_table_privilege(r.role, t.oid, w.privilege) END
UNION ALL
SELECT pg_catalog.format('PUBLIC may CREATE in schema %s', current_schema())
  FROM pg_catalog.pg_namespace n CROSS JOIN LATERAL pg_catalog.aclexplode(n.nspacl) a
 WHERE n.nspname = current_schema() AND a.grantee = 0 AND a.privilege_type = 'CREATE'
UNION ALL
SELECT pg_catalog.format('%s may CREATE in schema %s', r.role, current_schema())
  FROM reader r
 WHERE pg_catalog.has_schema_privilege(r.role, current_schema(), 'CREATE')
