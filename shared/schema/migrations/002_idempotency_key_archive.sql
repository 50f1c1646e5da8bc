-- The permanent archive of expired keys. No response column: the archive holds
-- what is needed to answer a late retry (status, resource id, when) and nothing
-- that could carry personal data.
--
-- status_code 0 encodes a key that expired while still in flight (the request
-- never completed); every completed key carries its real HTTP status (100-599).
--
-- Monthly RANGE partitions on expired_at are created ahead of time and retired
-- by the partition manager (shared/partition). There is deliberately no DEFAULT
-- partition: it would forbid DETACH PARTITION ... CONCURRENTLY.
CREATE TABLE IF NOT EXISTS idempotency_key_archive (
    scoped_key  text COLLATE "C" NOT NULL,
    fingerprint bytea       NOT NULL,
    status_code smallint    NOT NULL,
    resource_id text,
    created_at  timestamptz NOT NULL,
    expired_at  timestamptz NOT NULL,
    PRIMARY KEY (scoped_key, expired_at)
) PARTITION BY RANGE (expired_at);
