-- Investigations select archived keys by created_at. The primary key orders
-- rows by key, so a narrow created_at window over a broad scope prefix would
-- read every row of the partitions it reaches. Rows arrive in the archive in
-- roughly created_at order (the sweeper moves the oldest expiries first), so
-- a BRIN index answers such a window by reading the block ranges that hold
-- it, plus at most a range or two around its edges, for a few pages per
-- partition of storage. Created on the partitioned table, it is created on
-- every partition, and on each partition attached later.
CREATE INDEX IF NOT EXISTS idempotency_key_archive_created_at_brin
    ON idempotency_key_archive USING brin (created_at) WITH (pages_per_range = 16);
