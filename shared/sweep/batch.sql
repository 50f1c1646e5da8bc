-- One sweep batch: move up to $1 expired live rows into the archive and delete
-- them, in one statement (and one transaction).
--
-- $1  batch size
-- $2  JSON path of the resource id inside the stored response, as text[]
-- $3  how long past its expiry a key still in flight stays live, in ms
-- $4  the longest resource id kept, in bytes (MaxResourceIDBytes in sweep.go)
--
-- The shape is claim, then DELETE ... RETURNING, then INSERT of exactly what
-- the DELETE returned:
--
--   claimed  locks the oldest expired rows through idempotency_keys_expires_at_idx
--            (FOR UPDATE SKIP LOCKED: concurrent sweepers never block each
--            other or take the same row) and keeps only their ctids, so the
--            CTE is a few bytes a row and never spills to disk. Carrying the
--            rows here (the jsonb response included) cost a tuplestore that
--            spilled at 10,000 rows and was read three times.
--   moved    deletes the claimed rows by ctid: a TID scan, no index probe.
--            Deleting by scoped_key = ANY(...) probed the primary key once a
--            row (about 110 of a batch's 240 ms at 10,000), and joining on the key
--            lets the planner pick a hash join over a sequential scan of the
--            whole live table once batches reach about 10,000 rows. The archive
--            row's values are computed here, from the version deleted.
--   archived inserts what moved returned, with ON CONFLICT DO NOTHING: a
--            live row whose archive row already exists (a key the Redis live
--            store archived at completion, rows an operator restored into
--            the live table) must still leave it. The sweeper runs this
--            statement without that clause first (see fastBatchSQL in
--            sweep.go): the speculative insertion costs 35-45 ms of a batch
--            of 10,000 on 2 cores (an extra probe, WAL record and buffer lock
--            a row), and a conflict is rare. A conflict then fails the whole
--            statement, which moves nothing, and the sweeper runs the batch
--            again with the clause.
--
-- Why deleting by ctid is safe (the invariant): a tuple this transaction has
-- locked FOR UPDATE cannot be updated, deleted or pruned by anyone else until
-- it ends, so the ctid claimed names that very row version when moved runs,
-- in the same statement and snapshot. The one row it can miss is a row whose
-- newer version was committed after the statement's snapshot was taken: the
-- lock follows the update to that version, whose ctid the snapshot cannot
-- see, so moved skips it. Such a row is neither deleted nor archived (the
-- INSERT reads only what the DELETE returned), stays live and expired, and
-- the next batch moves it. So every row leaves the live table together with
-- its archive row, in one transaction, and never one without the other.
--
-- The DELETE does not depend on the INSERT: a row whose archive row already
-- exists (ON CONFLICT DO NOTHING returns nothing for it) still leaves the live
-- table, or every later batch would select it again and the backlog would
-- never drain (the runbook's DELETE ... USING archived has that bug).
-- Rows that expire before year 1 (a BC date: written by hand or
-- by another writer) are never claimed: no archive partition can be named
-- or bounded for them, and as the oldest rows every batch would claim them
-- first, fail, and move nothing behind them. They stay live (the middleware
-- answers them 409 expired) and the sweeper reports them (unarchivableSQL).
-- Nor are keys longer than 2,000 bytes (only another writer can store one:
-- the middleware refuses keys over 512): the archive's primary key entry
-- holds expired_at beside the key, so an incompressible key that just fits
-- the live table's primary key can never fit the archive's, and as the
-- oldest row it would fail every batch in the same way.
-- A key still in flight is claimed $3 after its expiry (SWEEP_IN_FLIGHT_GRACE,
-- 15 minutes by default, as long as the Redis store keeps an in-flight
-- hash): a request that outlives its TTL by less completes its row, and the
-- archive keeps what it did rather than "expired in flight". Meanwhile the
-- middleware answers the live row as the archive would (409 expired, in
-- flight).
WITH claimed AS MATERIALIZED (
    SELECT ctid
      FROM idempotency_keys
     WHERE expires_at < now() AND expires_at >= '0001-01-01 00:00:00+00'
       AND octet_length(scoped_key) <= 2000
       AND (state = 'completed' OR expires_at < now() - $3 * interval '1 millisecond')
     ORDER BY expires_at
     LIMIT $1
       FOR UPDATE SKIP LOCKED
),
moved AS (
    DELETE FROM idempotency_keys
     WHERE ctid = ANY (ARRAY(SELECT ctid FROM claimed))
    RETURNING scoped_key,
              fingerprint,
              -- 0 marks a key that expired while still in flight.
              CASE WHEN state = 'completed' THEN status_code ELSE 0 END AS status_code,
              -- The id recorded at completion, else the one at the JSON path;
              -- a missing or non-string id is NULL, never an error. Bounded in
              -- archived below.
              COALESCE(resource_id,
                       CASE WHEN jsonb_typeof(response #> $2::text[]) = 'string' THEN response #>> $2::text[] END) AS resource_id,
              created_at,
              expires_at
),
archived AS (
    INSERT INTO idempotency_key_archive
           (scoped_key, fingerprint, status_code, resource_id, created_at, expired_at)
    -- An id over $4 bytes is NULL, as the middleware keeps none longer: the
    -- archive keeps it forever and every answer carries it. Only another
    -- writer's row can hold one (a long string at the JSON path, or in its
    -- resource_id column); the row still moves, without it.
    SELECT scoped_key, fingerprint, status_code,
           CASE WHEN octet_length(resource_id) <= $4 THEN resource_id END,
           created_at, expires_at
      FROM moved
    ON CONFLICT (scoped_key, expired_at) DO NOTHING
    RETURNING 1
)
SELECT (SELECT count(*) FROM claimed)  AS selected,
       (SELECT count(*) FROM archived) AS archived,
       (SELECT count(*) FROM moved)    AS removed
