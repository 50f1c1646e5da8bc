-- The live store: one row per idempotency key while its replay window is open.
-- API services write it (register, then complete); the sweeper moves expired rows
-- into idempotency_key_archive.
--
-- scoped_key uses the "C" collation: keys are opaque byte strings, so byte order is
-- both the only meaningful order and the fastest one, and it lets a key prefix be
-- answered with an index range scan.
CREATE TABLE IF NOT EXISTS idempotency_keys (
    scoped_key  text COLLATE "C" NOT NULL PRIMARY KEY,
    fingerprint bytea       NOT NULL CHECK (octet_length(fingerprint) = 32),
    state       text        NOT NULL DEFAULT 'in_flight' CHECK (state IN ('in_flight', 'completed')),
    status_code smallint             CHECK (status_code BETWEEN 100 AND 599),
    response    jsonb,
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    CONSTRAINT idempotency_keys_completed_has_status CHECK ((state = 'completed') = (status_code IS NOT NULL)),
    CONSTRAINT idempotency_keys_expires_after_created CHECK (expires_at > created_at)
);

-- The sweeper reads expired rows oldest first through this index.
CREATE INDEX IF NOT EXISTS idempotency_keys_expires_at_idx ON idempotency_keys (expires_at);
