-- The (live TTL, clock skew) pairs that writers of idempotency_keys have used,
-- and when. The live store (livestore.Postgres) holds a lease on its own pair
-- before it registers a key, and refuses a key whose timestamp lies further
-- ahead of the database clock than its skew. So every key registered under a
-- lease satisfies minted <= registered_at + skew_ms, and registered_at lies
-- within [first_used, used_until]. From that the store proves, for a fresh
-- key, whether any earlier registration of it can have expired (and so can
-- be in the archive), whatever TTLs were used, and skips the archive lookup
-- only when none can (see package keytime).
--
-- bounded = false marks writers that bounded nothing: keys registered before
-- this table existed (the row is added only when the live table or the
-- archive already holds rows). While it is present every fresh key is looked
-- up and archive lookups read every partition.
CREATE TABLE IF NOT EXISTS idempotency_writers (
    ttl_ms     bigint      NOT NULL CHECK (ttl_ms >= 0),
    skew_ms    bigint      NOT NULL CHECK (skew_ms >= 0),
    bounded    boolean     NOT NULL DEFAULT true,
    first_used timestamptz NOT NULL DEFAULT now(),
    used_until timestamptz NOT NULL,
    PRIMARY KEY (ttl_ms, skew_ms, bounded),
    CONSTRAINT idempotency_writers_bounded_ttl CHECK (NOT bounded OR ttl_ms > 0)
);

INSERT INTO idempotency_writers (ttl_ms, skew_ms, bounded, first_used, used_until)
SELECT 0, 0, false, '-infinity', 'infinity'
 WHERE (EXISTS (SELECT 1 FROM idempotency_keys) OR EXISTS (SELECT 1 FROM idempotency_key_archive))
ON CONFLICT DO NOTHING;
