-- The middleware records, at completion, the resource id it read from the
-- response and the response's content type. A JSON response is kept in
-- `response` (jsonb); any other body byte for byte in `response_raw`. The
-- sweeper archives resource_id when set and falls back to the JSON path.
ALTER TABLE idempotency_keys ADD COLUMN IF NOT EXISTS resource_id text;
ALTER TABLE idempotency_keys ADD COLUMN IF NOT EXISTS content_type text;
ALTER TABLE idempotency_keys ADD COLUMN IF NOT EXISTS response_raw bytea;
