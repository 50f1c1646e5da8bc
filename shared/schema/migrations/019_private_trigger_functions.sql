-- Only the owner may attach the archive's trigger functions to a table.
--
-- What broke: the trigger functions run as their owner (SECURITY DEFINER,
-- so that a role that may insert archive rows need not be able to write
-- the tables they keep), and name the tables and helper functions they use
-- through the schema of the table that fired them (TG_TABLE_SCHEMA), so
-- that one release serves every schema. PostgreSQL grants EXECUTE on a new
-- function to PUBLIC, and CREATE TRIGGER asks for no more: any role with
-- USAGE on the schema (the reader, the sweeper, the writer; in the default
-- public schema any login) could create a temporary table, attach one of
-- these functions to it, and have it act as the owner on tables and
-- functions of its own temporary schema, which may in turn do anything the
-- owner may: delete archive rows, so that a late retry runs again.
--
-- EXECUTE on every trigger function of the schema is revoked from PUBLIC.
-- A trigger fires whatever its function's privileges: the archive's own
-- triggers, and those a partition inherits from it, keep working; the
-- owner (and its members, the migrating and partitions users) may still
-- attach them. roles.sql revokes it again on every deploy that applies
-- the grants, so that a function a later migration creates is covered.
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure
          FROM pg_catalog.pg_proc p
          JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = pg_catalog.current_schema()
           AND p.prorettype = 'pg_catalog.trigger'::regtype
           AND pg_catalog.has_function_privilege('public', p.oid, 'EXECUTE')
    LOOP
        EXECUTE pg_catalog.format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$$;
