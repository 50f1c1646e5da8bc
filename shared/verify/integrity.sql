-- What verify's "tables are as migrate made them" check adds to the shape
-- schema.Mismatches reads: one row per problem, in the migrated schema
-- (current_schema()), none where the tables do not exist.
--
-- Why each matters:
--   - An UNLOGGED table (live, writers, an archive partition, the plain
--     keys index) is emptied by a crash: live keys run again, archived keys
--     are forgotten.
--   - idempotency_keys_unbounded_writer records a writer that does not
--     bound its keys' timestamps, and idempotency_writers_only_grow keeps
--     that record from shrinking: the archive skip trusts a key's timestamp
--     only while both hold, so without them a late retry can run twice.
--     idempotency_copy_pending_range queues a range the plain keys index
--     must read again. A disabled or replica-only trigger fires for no
--     ordinary session. (The archive's own recording triggers are the
--     recording check's.)
--   - idempotency_keys_expires_at_idx: every sweep batch reads the oldest
--     expiries through it; without it each batch reads the whole table.
--   - No write, TRUNCATE, REFERENCES or TRIGGER privilege on these tables
--     for PUBLIC or idempotency_reader (lookups only read), and no CREATE
--     in the schema for them.
WITH archive AS (
    SELECT p.relid
      FROM pg_catalog.pg_partition_tree(pg_catalog.to_regclass(pg_catalog.format('%I.idempotency_key_archive', current_schema()))) p
),
tbl AS (
    SELECT c.oid, c.relname::text AS relname, c.relpersistence, c.relacl, c.oid IN (SELECT relid FROM archive) AS in_archive
      FROM pg_catalog.pg_class c
      JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
     WHERE n.nspname = current_schema()
       AND c.relkind IN ('r', 'p')
       AND (c.relname IN ('idempotency_keys', 'idempotency_writers', 'idempotency_key_archive',
                          'idempotency_archive_plain_keys', 'idempotency_archive_plain_keys_pending',
                          'idempotency_archive_late_keys_pending')
            OR c.oid IN (SELECT relid FROM archive))
),
expected_trigger (relname, tgname) AS (
    VALUES ('idempotency_keys', 'idempotency_keys_unbounded_writer'),
           ('idempotency_writers', 'idempotency_writers_only_grow'),
           ('idempotency_archive_plain_keys_pending', 'idempotency_copy_pending_range')
),
write_privilege (privilege) AS (
    VALUES ('INSERT'), ('UPDATE'), ('DELETE'), ('TRUNCATE'), ('REFERENCES'), ('TRIGGER')
)
SELECT pg_catalog.format('%s is UNLOGGED: a crash empties it', t.relname)
  FROM tbl t
 WHERE t.relpersistence <> 'p'
UNION ALL
SELECT pg_catalog.format('%s has no trigger %s', e.relname, e.tgname)
  FROM expected_trigger e JOIN tbl t ON t.relname = e.relname
 WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_trigger g WHERE g.tgrelid = t.oid AND g.tgname = e.tgname)
UNION ALL
SELECT pg_catalog.format('trigger %s on %s is %s', g.tgname, t.relname,
                         CASE g.tgenabled WHEN 'D' THEN 'disabled' ELSE 'replica-only' END)
  FROM tbl t JOIN pg_catalog.pg_trigger g ON g.tgrelid = t.oid
 WHERE NOT t.in_archive AND NOT g.tgisinternal AND g.tgenabled NOT IN ('O', 'A')
UNION ALL
SELECT 'idempotency_keys has no valid index idempotency_keys_expires_at_idx (expires_at)'
  FROM tbl t
 WHERE t.relname = 'idempotency_keys'
   AND NOT EXISTS (SELECT FROM pg_catalog.pg_index i
                     JOIN pg_catalog.pg_class ic ON ic.oid = i.indexrelid
                    WHERE i.indrelid = t.oid AND ic.relname = 'idempotency_keys_expires_at_idx'
                      AND i.indisvalid AND i.indisready)
UNION ALL
SELECT pg_catalog.format('PUBLIC may %s on %s', a.privilege_type, t.relname)
  FROM tbl t CROSS JOIN LATERAL pg_catalog.aclexplode(t.relacl) a
 WHERE a.grantee = 0 AND a.privilege_type IN (SELECT privilege FROM write_privilege)
UNION ALL
SELECT pg_catalog.format('idempotency_reader may %s on %s', w.privilege, t.relname)
  FROM tbl t CROSS JOIN write_privilege w
 WHERE pg_catalog.to_regrole('idempotency_reader') IS NOT NULL
   AND pg_catalog.has_table_privilege('idempotency_reader', t.oid, w.privilege)
UNION ALL
SELECT pg_catalog.format('%s may CREATE in schema %s', r.role, current_schema())
  FROM (VALUES ('PUBLIC'), ('idempotency_reader')) r (role)
 WHERE CASE r.role
         WHEN 'PUBLIC' THEN EXISTS (SELECT FROM pg_catalog.pg_namespace n CROSS JOIN LATERAL pg_catalog.aclexplode(n.nspacl) a
                                     WHERE n.nspname = current_schema() AND a.grantee = 0 AND a.privilege_type = 'CREATE')
         ELSE pg_catalog.to_regrole('idempotency_reader') IS NOT NULL
              AND pg_catalog.has_schema_privilege('idempotency_reader', current_schema(), 'CREATE')
       END
