-- The owner's code never resolves a name in another session's temporary
-- schema, and a lease in idempotency_writers only grows.
--
-- What broke (1): the functions that run as the owner (SECURITY DEFINER)
-- set search_path = pg_catalog. A search_path that does not name pg_temp
-- searches it first for tables and types (only functions and operators
-- are exempt): the archive's recording trigger declares variables of
-- timestamptz and text, which resolved to a domain of those names in the
-- temporary schema of the session that fired it. The sweeper (which may
-- insert archive rows) could create such a domain, its CHECK calling a
-- function of its own, and insert a row: that function then ran as the
-- owner, and could delete archive rows. Every SECURITY DEFINER function of
-- the schema now searches pg_catalog, then pg_temp, last; the helpers they
-- call run under the same setting. roles.sql sets it again on every deploy
-- that applies the grants.
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure
          FROM pg_catalog.pg_proc p
          JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = pg_catalog.current_schema() AND p.prosecdef
           AND NOT coalesce('search_path=pg_catalog, pg_temp' = ANY (p.proconfig), false)
    LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = pg_catalog, pg_temp', f);
    END LOOP;
END
$$;

-- What broke (2): the writer and the sweeper, which renew their leases
-- (UPDATE of first_used and used_until), could as well shrink one, which
-- the archive skip reads as the proof that no key of that writer can have
-- been archived before first_used or after used_until: a late retry of an
-- archived key would skip the archive and run again. A lease's update now
-- only moves first_used earlier and used_until later (as the lease's own
-- upsert does); the owner may disable the trigger for hand repairs.
CREATE OR REPLACE FUNCTION idempotency_writers_only_grow() RETURNS trigger
    LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    NEW.first_used := LEAST(OLD.first_used, NEW.first_used);
    NEW.used_until := GREATEST(OLD.used_until, NEW.used_until);
    RETURN NEW;
END
$$;
REVOKE EXECUTE ON FUNCTION idempotency_writers_only_grow() FROM PUBLIC;

DROP TRIGGER IF EXISTS idempotency_writers_only_grow ON idempotency_writers;
CREATE TRIGGER idempotency_writers_only_grow
    BEFORE UPDATE OF first_used, used_until ON idempotency_writers
    FOR EACH ROW EXECUTE FUNCTION idempotency_writers_only_grow();
