-- The (live TTL, clock skew) pairs that writers of idempotency_keys and of the
-- archive have used, and when. The live store (livestore.Postgres) holds a
-- lease on its own pair before it registers a key, and refuses a key whose
-- timestamp lies further ahead of the database clock than its skew. So every
-- key registered under a lease satisfies minted <= registered_at + skew_ms,
-- and registered_at lies within [first_used, used_until]. From that the store
-- proves, for a fresh key, whether any earlier registration of it can have
-- expired (and so can be in the archive), whatever TTLs were used, and skips
-- the archive lookup only when none can (see package keytime). A writer that
-- archives at completion (livestore.Redis) records ttl_ms = 0: its keys can
-- be in the archive from the moment they are registered.
--
-- bounded = false marks writers that bounded nothing: keys stored before this
-- table existed (the row is added when the live table or the archive already
-- holds rows), and any insert into idempotency_keys that does not say which
-- skew it enforced (an older release of the middleware during a rolling
-- deploy, a hand-written insert; see the trigger below). While such a row is
-- present every fresh key is looked up and archive lookups read every
-- partition.
CREATE TABLE IF NOT EXISTS idempotency_writers (
    ttl_ms     bigint      NOT NULL CHECK (ttl_ms >= 0),
    skew_ms    bigint      NOT NULL CHECK (skew_ms >= 0),
    bounded    boolean     NOT NULL DEFAULT true,
    first_used timestamptz NOT NULL DEFAULT now(),
    used_until timestamptz NOT NULL,
    PRIMARY KEY (ttl_ms, skew_ms, bounded)
);

-- Where neither table shows a row yet, an insert into the archive may still
-- be running (an older Redis store archives at completion): wait for it, and
-- hold off the next until this migration commits. Only then: SHARE waits for
-- the archive's maintenance too (autovacuum, ANALYZE), which a table with
-- rows may be under for long, and it is taken before the live table's lock
-- below, so that registrations never queue behind the wait. Where a row
-- shows, the record below is made whatever else arrives.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM idempotency_keys) AND NOT EXISTS (SELECT 1 FROM idempotency_key_archive) THEN
        LOCK TABLE idempotency_key_archive IN SHARE MODE;
    END IF;
END
$$;

-- The skew a row's writer enforced when it registered the row. NULL: a writer
-- that enforced none.
ALTER TABLE idempotency_keys ADD COLUMN IF NOT EXISTS skew_ms bigint;

-- A row inserted without skew_ms records a writer that bounded nothing. The
-- trigger fires only for such rows (WHEN), so it costs the live store nothing.
-- SECURITY DEFINER: the inserting role need not be able to write the table.
-- The writers table is the one beside the live table (TG_TABLE_SCHEMA), with
-- a fixed search_path so that the definer's rights cannot be redirected.
CREATE OR REPLACE FUNCTION idempotency_record_unbounded_writer() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    EXECUTE format('INSERT INTO %I.idempotency_writers (ttl_ms, skew_ms, bounded, first_used, used_until)
                    VALUES (0, 0, false, ''-infinity'', ''infinity'') ON CONFLICT DO NOTHING', TG_TABLE_SCHEMA);
    RETURN NEW;
END
$$;

DROP TRIGGER IF EXISTS idempotency_keys_unbounded_writer ON idempotency_keys;
CREATE TRIGGER idempotency_keys_unbounded_writer
    BEFORE INSERT ON idempotency_keys
    FOR EACH ROW WHEN (NEW.skew_ms IS NULL)
    EXECUTE FUNCTION idempotency_record_unbounded_writer();

-- Keys stored before this table existed, checked only now: the ALTER TABLE
-- above waited for every insert into idempotency_keys already running (an
-- older release's, still uncommitted when this migration began, whose row
-- a check before it would not have seen) and holds off the rest until this
-- migration commits, after which the trigger records them. The archive's
-- lock, taken before it, did the same for a writer that archives without
-- the live table (an older Redis store).
INSERT INTO idempotency_writers (ttl_ms, skew_ms, bounded, first_used, used_until)
SELECT 0, 0, false, '-infinity', 'infinity'
 WHERE (EXISTS (SELECT 1 FROM idempotency_keys) OR EXISTS (SELECT 1 FROM idempotency_key_archive))
ON CONFLICT DO NOTHING;
