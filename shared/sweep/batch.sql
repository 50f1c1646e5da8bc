-- One sweep batch: move up to $1 expired live rows into the archive and delete
-- them, in one statement (and one transaction).
--
-- $1  batch size
-- $2  JSON path of the resource id inside the stored response, as text[]
--
-- Every step is index-driven at any batch size: the expired rows come from
-- idempotency_keys_expires_at_idx, and the DELETE finds them again through the
-- primary key (scoped_key = ANY(array)). Joining the CTE back to the live table
-- instead lets the planner switch to a hash join over a sequential scan of the
-- whole live table once batches reach about 10,000 rows.
--
-- The DELETE takes its keys from `expired`, not from what the INSERT returned: a
-- row whose archive row already exists (ON CONFLICT DO NOTHING returns nothing
-- for it) must still leave the live table, or every later batch would select it
-- again and the backlog would never drain.
WITH expired AS MATERIALIZED (
    SELECT scoped_key, fingerprint, state, status_code, response, resource_id, created_at, expires_at
      FROM idempotency_keys
     WHERE expires_at < now()
     ORDER BY expires_at
     LIMIT $1
       FOR UPDATE SKIP LOCKED
),
archived AS (
    INSERT INTO idempotency_key_archive
           (scoped_key, fingerprint, status_code, resource_id, created_at, expired_at)
    SELECT scoped_key,
           fingerprint,
           -- 0 marks a key that expired while still in flight.
           CASE WHEN state = 'completed' THEN status_code ELSE 0 END,
           -- The id recorded at completion, else the one at the JSON path;
           -- a missing or non-string id is NULL, never an error.
           COALESCE(resource_id,
                    CASE WHEN jsonb_typeof(response #> $2::text[]) = 'string' THEN response #>> $2::text[] END),
           created_at,
           expires_at
      FROM expired
    ON CONFLICT (scoped_key, expired_at) DO NOTHING
    RETURNING 1
),
removed AS (
    DELETE FROM idempotency_keys
     WHERE scoped_key = ANY (ARRAY(SELECT scoped_key FROM expired))
    RETURNING 1
)
SELECT (SELECT count(*) FROM expired)  AS selected,
       (SELECT count(*) FROM archived) AS archived,
       (SELECT count(*) FROM removed)  AS removed
