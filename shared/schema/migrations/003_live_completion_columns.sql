-- The middleware records, at completion, the resource id it read from the
-- response and the response's content type (for an exact replay). The sweeper
-- archives resource_id when set and falls back to the JSON path otherwise.
ALTER TABLE idempotency_keys ADD COLUMN IF NOT EXISTS resource_id text;
ALTER TABLE idempotency_keys ADD COLUMN IF NOT EXISTS content_type text;
