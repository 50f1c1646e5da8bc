-- What the sweeper, the live stores and lookups rely on in the two tables
-- migrations 001 and 002 create with CREATE TABLE IF NOT EXISTS, which
-- leaves a table of the same name made by another tool as it is: one row
-- per difference, none where a table does not exist yet (its migration
-- creates it right). Read in the migrated schema (current_schema()), not
-- through the search_path, which may find a table of that name elsewhere.
--
-- Why each matters:
--   - idempotency_keys a plain table: a sweep batch deletes the rows it
--     claimed by ctid, which names one row only within one table.
--   - The columns the sweeper reads and the archive holds, of their types:
--     a batch fails on a column missing, or on a value its cast refuses
--     (an integer status of 40000 into smallint).
--   - The live columns the archive copies NOT NULL, and a completed row
--     carrying a status (idempotency_keys_completed_has_status, validated):
--     the archive's columns are NOT NULL, so one such row fails every sweep
--     batch that claims it, and as the oldest expired row that is every
--     batch: nothing behind it is archived again.
--   - scoped_key in the "C" collation: an investigation reads a key prefix
--     as the byte range [prefix, prefix with its last byte + 1), which
--     another collation orders otherwise (ICU sorts ';' before ':'), and
--     then misses archived keys without an error.
--   - The primary keys: the live store's and the sweep's ON CONFLICT
--     targets, and the archive's one row per (key, expiry).
--   - The archive partitioned BY RANGE (expired_at): the partition manager
--     and every lookup read it by month.
WITH rel AS (
    SELECT c.oid, c.relname::text AS relname, c.relkind
      FROM pg_catalog.pg_class c
      JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
     WHERE n.nspname = current_schema()
       AND c.relname IN ('idempotency_keys', 'idempotency_key_archive')
),
not_null (relname, attname) AS (
    VALUES ('idempotency_keys', 'scoped_key'), ('idempotency_keys', 'fingerprint'), ('idempotency_keys', 'state'),
           ('idempotency_keys', 'created_at'), ('idempotency_keys', 'expires_at'),
           ('idempotency_key_archive', 'scoped_key'), ('idempotency_key_archive', 'fingerprint'),
           ('idempotency_key_archive', 'status_code'), ('idempotency_key_archive', 'created_at'),
           ('idempotency_key_archive', 'expired_at')
),
column_type (relname, attname, typ, required) AS (
    VALUES ('idempotency_keys', 'scoped_key', 'text', true), ('idempotency_keys', 'fingerprint', 'bytea', true),
           ('idempotency_keys', 'state', 'text', true), ('idempotency_keys', 'status_code', 'smallint', true),
           ('idempotency_keys', 'response', 'jsonb', true),
           ('idempotency_keys', 'created_at', 'timestamp with time zone', true),
           ('idempotency_keys', 'expires_at', 'timestamp with time zone', true),
           -- Added by later migrations where missing (ADD COLUMN IF NOT
           -- EXISTS keeps one that exists, whatever its type).
           ('idempotency_keys', 'resource_id', 'text', false), ('idempotency_keys', 'content_type', 'text', false),
           ('idempotency_keys', 'response_raw', 'bytea', false), ('idempotency_keys', 'skew_ms', 'bigint', false),
           ('idempotency_keys', 'registration', 'bytea', false),
           ('idempotency_key_archive', 'scoped_key', 'text', true), ('idempotency_key_archive', 'fingerprint', 'bytea', true),
           ('idempotency_key_archive', 'status_code', 'smallint', true), ('idempotency_key_archive', 'resource_id', 'text', true),
           ('idempotency_key_archive', 'created_at', 'timestamp with time zone', true),
           ('idempotency_key_archive', 'expired_at', 'timestamp with time zone', true)
),
primary_key (relname, cols) AS (
    VALUES ('idempotency_keys', ARRAY['scoped_key']), ('idempotency_key_archive', ARRAY['scoped_key', 'expired_at'])
)
SELECT format('%s is not a %s table', r.relname, CASE r.relname WHEN 'idempotency_keys' THEN 'plain' ELSE 'partitioned' END)
  FROM rel r
 WHERE r.relkind <> CASE r.relname WHEN 'idempotency_keys' THEN 'r' ELSE 'p' END::"char"
UNION ALL
SELECT format('%s.%s is not NOT NULL', w.relname, w.attname)
  FROM rel r JOIN not_null w ON w.relname = r.relname
 WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a
                    WHERE a.attrelid = r.oid AND a.attname = w.attname AND a.attnotnull AND NOT a.attisdropped)
UNION ALL
SELECT CASE WHEN a.attnum IS NULL THEN format('%s has no column %s (%s)', w.relname, w.attname, w.typ)
            ELSE format('%s.%s is %s, not %s', w.relname, w.attname, pg_catalog.format_type(a.atttypid, NULL), w.typ) END
  FROM rel r JOIN column_type w ON w.relname = r.relname
  LEFT JOIN pg_catalog.pg_attribute a ON a.attrelid = r.oid AND a.attname = w.attname AND a.attnum > 0 AND NOT a.attisdropped
 WHERE (a.attnum IS NULL AND w.required) OR pg_catalog.format_type(a.atttypid, NULL) <> w.typ
UNION ALL
SELECT format('%s.scoped_key is not in the "C" collation', r.relname)
  FROM rel r JOIN pg_catalog.pg_attribute a ON a.attrelid = r.oid AND a.attname = 'scoped_key' AND NOT a.attisdropped
 WHERE pg_catalog.format_type(a.atttypid, NULL) = 'text'
   AND a.attcollation <> 'pg_catalog."C"'::pg_catalog.regcollation
   -- The database's default, where that is libc's C or POSIX, is the same.
   AND NOT (a.attcollation = 'pg_catalog."default"'::pg_catalog.regcollation
            AND EXISTS (SELECT FROM pg_catalog.pg_database d
                         WHERE d.datname = current_database() AND d.datcollate IN ('C', 'POSIX')
                           -- datlocprovider from PostgreSQL 15 on ('i': ICU, whatever datcollate says)
                           AND coalesce(pg_catalog.to_jsonb(d) ->> 'datlocprovider', 'c') = 'c'))
UNION ALL
SELECT format('%s has no primary key (%s) that ON CONFLICT can use (none, a DEFERRABLE one, or one whose index is not valid)', k.relname, array_to_string(k.cols, ', '))
  FROM rel r JOIN primary_key k ON k.relname = r.relname
 WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_constraint c
                    WHERE c.conrelid = r.oid AND c.contype = 'p'
                      -- ON CONFLICT takes no DEFERRABLE arbiter, nor one
                      -- whose index is not valid (a key added to the
                      -- partitioned parent ONLY): every registration, or
                      -- sweep retry, would fail.
                      AND NOT c.condeferrable
                      AND EXISTS (SELECT FROM pg_catalog.pg_index i WHERE i.indexrelid = c.conindid AND i.indisvalid)
                      AND ARRAY(SELECT a.attname::text
                                  FROM unnest(c.conkey) WITH ORDINALITY AS u (attnum, i)
                                  JOIN pg_catalog.pg_attribute a ON a.attrelid = r.oid AND a.attnum = u.attnum
                                 ORDER BY u.i) = k.cols)
UNION ALL
SELECT 'idempotency_keys has no validated CHECK constraint idempotency_keys_completed_has_status ((state = ''completed'') = (status_code IS NOT NULL))'
  FROM rel r
 WHERE r.relname = 'idempotency_keys'
   -- Its rule, not its name alone (as PostgreSQL 15 and 17 print it),
   -- printed for this table's constraint alone (OFFSET 0 keeps the filter
   -- first: printing another table's, dropped meanwhile, fails the query).
   AND NOT EXISTS (SELECT 1
                     FROM (SELECT c.oid FROM pg_catalog.pg_constraint c
                            WHERE c.conrelid = r.oid AND c.contype = 'c' AND c.convalidated
                              AND c.conname = 'idempotency_keys_completed_has_status'
                           OFFSET 0) k
                    WHERE pg_catalog.pg_get_constraintdef(k.oid) = 'CHECK (((state = ''completed''::text) = (status_code IS NOT NULL)))')
UNION ALL
SELECT format('idempotency_key_archive is partitioned %s, not RANGE (expired_at)', pg_catalog.pg_get_partkeydef(r.oid))
  FROM rel r
 WHERE r.relname = 'idempotency_key_archive' AND r.relkind = 'p'
   AND pg_catalog.pg_get_partkeydef(r.oid) <> 'RANGE (expired_at)'
