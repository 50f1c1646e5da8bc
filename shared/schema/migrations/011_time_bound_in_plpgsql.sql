-- idempotency_key_time_bound (migration 010) again, the same rule in
-- PL/pgSQL: a lookup of a key minted long ago spent most of its time in it.
--
-- What cost: the lookup's read of where a key's late rows are
-- (archive.lateKeySQL) calls the function four times to check that the
-- database reads the key's timestamp as the lookup does. As a SQL function
-- with a subquery it cannot be inlined, so each call parses and plans its body
-- afresh: a custom plan (every lookup behind RDS Proxy, where nothing is
-- prepared) folded the two calls on constants while planning, about 1.8 ms of
-- the statement's 2.4 ms planning on 2 cores, and each plan ran the two others
-- (0.15 ms; 0.35 ms in a generic plan, which runs all four). A PL/pgSQL
-- function is compiled once a connection and its simple expressions are
-- cached: measured on the same statement, planning 0.6 ms and running
-- 0.03 ms (custom), 0.04 ms (generic). Inlining the SQL instead (the ULID's
-- ten characters written out) ran faster but planned slower still: the
-- expanded expression is large.
--
-- Why this is the same function (the invariant the late-key records depend
-- on; FuzzLateRuleMatchesKeytime holds it against keytime.FromKey, and
-- TestTimeBoundIsMigration010s against migration 010's body):
--   - NULL in, NULL out, as before.
--   - ms, the instant's Unix milliseconds rounded up, is at most 0 exactly
--     when the instant is at or before the epoch, '-infinity' included: ''.
--   - ms is at least 2^48 exactly when the instant lies after 2^48 - 1 ms
--     past the epoch, 10889-08-02 05:31:50.655 UTC (the Unix milliseconds of
--     that instant are exactly 281474976710655), 'infinity' included: '8' for
--     a ULID, 'g' otherwise. Only then is ms computed, so it fits a bigint.
--   - A ULID's ten characters are ms's 5-bit groups from the most significant
--     (shift 45) to the least (shift 0), each looked up in the same alphabet,
--     as string_agg over i = 0..9 with shift 5 * (9 - i) made them; a UUIDv7's
--     prefix is the same lpad(to_hex(ms), 12, '0').
-- No search_path is set, as before (a SET clause costs every call): the body
-- names only pg_catalog functions, which the trigger's search_path
-- (pg_catalog) resolves too, and each operator's operands have the types of
-- a pg_catalog operator, which an operator of the same name in a schema on a
-- caller's search_path cannot then shadow (pg_catalog is searched first).
-- Were one shadowed all the same, a lookup would find that the database reads
-- the key's timestamp otherwise and read every month since.
CREATE OR REPLACE FUNCTION idempotency_key_time_bound(instant timestamptz, ulid boolean) RETURNS text
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    ms    bigint;
    bound text := '';
BEGIN
    IF instant IS NULL OR ulid IS NULL THEN
        RETURN NULL;
    ELSIF instant <= '1970-01-01 00:00:00+00' THEN
        RETURN '';
    ELSIF instant > '10889-08-02 05:31:50.655+00' THEN
        RETURN CASE WHEN ulid THEN '8' ELSE 'g' END;
    END IF;
    ms := ceil(extract(epoch FROM instant) * 1000::numeric);
    IF NOT ulid THEN
        RETURN lpad(to_hex(ms), 12, '0');
    END IF;
    FOR i IN REVERSE 9..0 LOOP
        bound := bound || substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ', ((ms >> (5 * i)) & 31::bigint)::int + 1, 1);
    END LOOP;
    RETURN bound;
END
$$;
