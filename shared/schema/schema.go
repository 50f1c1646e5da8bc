// Package schema owns the database schema of the idempotency archive: the live
// table idempotency_keys, the partitioned archive idempotency_key_archive and the
// least-privilege roles that use them.
//
// Migrations are numbered SQL files embedded in the binary and applied with
// tern's migrate package, which holds a PostgreSQL advisory lock while it runs,
// so several deployers may call Migrate at once:
//
//	err := schema.Migrate(ctx, conn, logger)
//
// Migrations apply to the first schema on the connection's search_path (public
// unless the connection string sets search_path). Partitions are not created
// here: they depend on the current date and are the partition manager's job
// (package partition), which should run right after Migrate.
package schema

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/tern/v2/migrate"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

//go:embed roles.sql
var rolesSQL string

//go:embed shape.sql
var shapeSQL string

// VersionTable is the table, in the migrated schema, where tern records the
// applied migration version.
const VersionTable = "idempotency_archive_schema_version"

// Roles created by Migrate where the connecting user may create roles.
const (
	OwnerRole   = "idempotency_owner"   // runs DDL: migrations, partitions
	SweeperRole = "idempotency_sweeper" // reads and deletes live rows, inserts archive rows
	ReaderRole  = "idempotency_reader"  // reads the archive (lookups, investigations)
	WriterRole  = "idempotency_writer"  // the Postgres live store: registers, completes, releases live keys
)

// ErrSchemaAhead means the database's schema is newer than any migration
// this code embeds: an older release running against a database a newer one
// migrated (a rollback). Migrate changes nothing then.
var ErrSchemaAhead = errors.New("schema: the database's schema is newer than this code")

// ErrTableMismatch means a table the migrations create already existed,
// made by another tool, before the migration that creates it ran, without
// what the sweeper, the live stores or lookups rely on (see Mismatches).
// The migrations create tables only where none exists (CREATE TABLE IF NOT
// EXISTS), so Migrate refuses such a table, before applying anything,
// rather than leave it as it is.
var ErrTableMismatch = errors.New("schema: a table exists with another definition than the migrations give it")

// Querier runs a query: a *pgx.Conn, a *pgxpool.Pool or a pgx.Tx.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Mismatches lists how idempotency_keys and idempotency_key_archive, in the
// schema first on q's search_path, differ from what the migrations create
// in ways the sweeper, the live stores or lookups rely on (shape.sql says
// why each matters): a column the sweeper reads or the archive holds
// missing or of another type, a live column the archive copies that may be NULL, a
// completed row allowed without a status, another primary key, an archive
// not partitioned by range of expired_at. Empty when both match, or do not
// exist yet.
func Mismatches(ctx context.Context, q Querier) ([]string, error) {
	rows, err := q.Query(ctx, shapeSQL)
	if err != nil {
		return nil, fmt.Errorf("read table definitions: %w", err)
	}
	problems, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("read table definitions: %w", err)
	}
	return problems, nil
}

// recordedVersion reads the version tern recorded in versionTable (a
// sanitized, qualified name), 0 when the table does not exist yet.
func recordedVersion(ctx context.Context, conn *pgx.Conn, versionTable string) (int32, error) {
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", versionTable).Scan(&exists); err != nil {
		return 0, fmt.Errorf("read schema version: %w", err)
	}
	if !exists {
		return 0, nil
	}
	var v int32
	if err := conn.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM "+versionTable).Scan(&v); err != nil {
		return 0, fmt.Errorf("read schema version: %w", err)
	}
	return v, nil
}

// Version reads the schema version migrate recorded in the schema first on
// q's search_path (current_schema()), 0 where it recorded none.
func Version(ctx context.Context, q Querier) (int32, error) {
	rows, err := q.Query(ctx, versionTableSQL, VersionTable)
	if err != nil {
		return 0, fmt.Errorf("read schema version: %w", err)
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(tables) == 0 {
		return 0, err
	}
	rows, err = q.Query(ctx, "SELECT coalesce(max(version), 0) FROM "+tables[0])
	if err != nil {
		return 0, fmt.Errorf("read schema version: %w", err)
	}
	v, err := pgx.CollectExactlyOneRow(rows, pgx.RowTo[int32])
	if err != nil {
		return 0, fmt.Errorf("read schema version: %w", err)
	}
	return v, nil
}

// versionTableSQL names table $1 of the current schema, quoted, where it
// exists.
const versionTableSQL = `
SELECT format('%I.%I', current_schema(), $1::text)
 WHERE to_regclass(format('%I.%I', current_schema(), $1::text)) IS NOT NULL`

// Result reports what Migrate did.
type Result struct {
	FromVersion int32 `json:"from_version"`
	ToVersion   int32 `json:"to_version"`
	// RolesCreated names the roles this run created: empty when they all
	// existed, or when the connecting user may not create roles.
	RolesCreated []string `json:"roles_created"`
	// GrantsApplied says the roles' grants were (re)applied; false when the
	// connecting user may not create roles (a warning is logged).
	GrantsApplied bool `json:"grants_applied"`
}

// LatestVersion is the schema version the embedded migrations lead to.
func LatestVersion() int32 {
	entries, err := fs.Glob(migrationFiles, "migrations/*.sql")
	if err != nil {
		panic(err) // a constant pattern
	}
	return int32(len(entries))
}

// Migrate applies every pending migration and then (re)applies the role grants.
// It is safe to call repeatedly and concurrently.
//
// Both run as conn's user. The grants need a user that may create roles;
// migrations run the code of the owner role (tern's own statements resolve
// names through the schema's search_path, and a migration fires the
// triggers on the owner's tables and calls its functions), so a privileged
// user should apply them with ApplyMigrations over a connection of an
// owner's member, and then call EnsureRoles itself (as provision.Run does).
func Migrate(ctx context.Context, conn *pgx.Conn, logger *slog.Logger) (Result, error) {
	return migrateTo(ctx, conn, logger, -1)
}

// ApplyMigrations applies every pending migration, as Migrate does, without
// the role grants (EnsureRoles).
func ApplyMigrations(ctx context.Context, conn *pgx.Conn, logger *slog.Logger) (Result, error) {
	return migrateTo(ctx, conn, logger, -2)
}

// EnsureRoles (re)applies the role grants to the first schema on conn's
// search_path, as Migrate does after the migrations, and returns the roles
// it created and whether it applied the grants (false where conn's user may
// not create roles). Every name it runs resolves in pg_catalog alone.
func EnsureRoles(ctx context.Context, conn *pgx.Conn, logger *slog.Logger) ([]string, bool, error) {
	schemaName, err := currentSchema(ctx, conn)
	if err != nil {
		return []string{}, false, err
	}
	var created []string
	var applied bool
	err = patiently(ctx, func() error {
		created, applied, err = ensureRoles(ctx, conn, schemaName, logger)
		return err
	})
	return created, applied, err
}

// migrateTo migrates to version target, or to the latest when target < 0
// (with the grants when target is -1).
func migrateTo(ctx context.Context, conn *pgx.Conn, logger *slog.Logger, target int32) (Result, error) {
	res := Result{RolesCreated: []string{}}
	schemaName, err := currentSchema(ctx, conn)
	if err != nil {
		return res, err
	}
	versionTable := pgx.Identifier{schemaName, VersionTable}.Sanitize()
	// Before migrations 001 and 002 run, which create the two tables only
	// where none exists (CREATE TABLE IF NOT EXISTS): a table made by
	// another tool keeps its definition, and one live row it lets through
	// (a completed row without a status) fails every sweep. Once they ran,
	// the tables are the migrations' own, and a later version's (after a
	// rollback of the code) is not this code's to judge.
	recorded, err := recordedVersion(ctx, conn, versionTable)
	if err != nil {
		return res, err
	}
	if recorded < 2 {
		problems, err := Mismatches(ctx, conn)
		if err != nil {
			return res, err
		}
		if len(problems) > 0 {
			return res, fmt.Errorf("%w, in schema %s: %s; give the table that definition, or migrate into another schema (search_path), and run migrate again",
				ErrTableMismatch, schemaName, strings.Join(problems, "; "))
		}
	}

	// tern holds a session-level advisory lock, one for every schema of the
	// database, while it migrates, and releases it under ctx: a ctx that
	// ended between two of its statements (a Lambda's deadline right after
	// the last COMMIT) leaves the lock on a connection the caller may
	// return to its pool, and every later migration of the database waits
	// on it. Closing the connection ends the session and its locks; with
	// its ctx ended, the caller has no use for it.
	defer func() {
		if ctx.Err() != nil && !conn.IsClosed() {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			defer cancel()
			_ = conn.Close(cctx)
		}
	}()
	m, err := migrate.NewMigrator(ctx, conn, versionTable)
	if err != nil {
		return res, fmt.Errorf("prepare migrator: %w", err)
	}
	sub, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		return res, fmt.Errorf("open embedded migrations: %w", err)
	}
	if err := m.LoadMigrations(sub); err != nil {
		return res, fmt.Errorf("load embedded migrations: %w", err)
	}
	if res.FromVersion, err = m.GetCurrentVersion(ctx); err != nil {
		return res, fmt.Errorf("read schema version: %w", err)
	}
	if latest := int32(len(m.Migrations)); res.FromVersion > latest {
		res.ToVersion = res.FromVersion
		return res, fmt.Errorf("%w: it is at version %d, this code knows versions up to %d", ErrSchemaAhead, res.FromVersion, latest)
	}
	pinned, restore, err := pinSession(ctx, conn)
	if err != nil {
		return res, err
	}
	defer restore()
	m.OnStart = func(seq int32, name, _, _ string) {
		logger.InfoContext(ctx, "applying migration", "version", seq, "name", name, "schema", schemaName)
		// tern runs RESET ALL after each migration, which puts back the
		// connection's startup settings: set them again for each, inside
		// its transaction (a failure here fails the migration's SQL after
		// it).
		pinned.apply(ctx, conn)
	}
	err = patiently(ctx, func() error {
		if target < 0 {
			return m.Migrate(ctx)
		}
		return m.MigrateTo(ctx, target)
	})
	// The last migration's RESET ALL: the grants below act on the
	// search_path's schema.
	pinned.apply(ctx, conn)
	if err != nil {
		return res, fmt.Errorf("apply migrations: %w", err)
	}
	if res.ToVersion, err = m.GetCurrentVersion(ctx); err != nil {
		return res, fmt.Errorf("read schema version: %w", err)
	}

	if target != -1 {
		// An older version (tests of upgrades), whose grants are not
		// these, or the migrations alone.
		return res, nil
	}
	res.RolesCreated, res.GrantsApplied, err = EnsureRoles(ctx, conn, logger)
	return res, err
}

// A migration's ALTER TABLE, or the grants' ALTER ... OWNER TO, waits for an
// ACCESS EXCLUSIVE lock behind any transaction that has read the table (an
// operator's query, pg_dump), and every live-store registration and sweep
// would queue behind that wait, failing on its own timeout, for as long as
// it lasted: and a migrator killed while waiting (archivectl, a closed SSH
// session) leaves its backend queued until that transaction ends. So every
// lock wait of a migration is bounded by lockWait, and a migration or the
// grants that run out of it roll back and try again after lockPause, for
// up to lockPatience, then fail with a line that says so. Migrations 10, 12
// and 13 take their locks without waiting at all and try again themselves.
const (
	lockWait     = 500 * time.Millisecond
	lockPause    = 50 * time.Millisecond
	lockPatience = 2 * time.Minute
)

// lockTimeout is lockWait as a lock_timeout setting.
var lockTimeout = fmt.Sprintf("%dms", lockWait.Milliseconds())

// session is what every migration runs under: lock_timeout bounded to
// lockWait, and the search_path the connection had when Migrate began. tern
// runs RESET ALL after each migration, which puts back the connection's
// startup values: without setting them again, the bound would be lifted for
// the migrations after the first, and a search_path SET after connecting
// (not in the connection string) would send them into another schema, while
// the version table, named with its schema, recorded them here.
type session struct{ searchPath string }

// pinSessionSQL reads the session's lock_timeout and search_path and sets
// the first to lockTimeout.
const pinSessionSQL = "SELECT pg_catalog.current_setting('lock_timeout'), pg_catalog.current_setting('search_path'), pg_catalog.set_config('lock_timeout', $1, false)"

// setSessionSQL sets lock_timeout and search_path for the session.
const setSessionSQL = "SELECT pg_catalog.set_config('lock_timeout', $1, false), pg_catalog.set_config('search_path', $2, false)"

// pinSession bounds conn's lock waits to lockWait and returns the session to
// apply after each RESET ALL, and what puts conn's settings back as they
// were.
func pinSession(ctx context.Context, conn *pgx.Conn) (session, func(), error) {
	var previous string
	var pinned session
	err := conn.QueryRow(ctx, pinSessionSQL, lockTimeout).Scan(&previous, &pinned.searchPath, new(string))
	if err != nil {
		return pinned, nil, fmt.Errorf("set lock_timeout: %w", err)
	}
	return pinned, func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_, _ = conn.Exec(ctx, setSessionSQL, previous, pinned.searchPath)
	}, nil
}

// apply sets the session's settings on conn again; an error shows in the
// statement after it, which runs on a failed connection or transaction.
func (s session) apply(ctx context.Context, conn *pgx.Conn) {
	_, _ = conn.Exec(ctx, setSessionSQL, lockTimeout, s.searchPath)
}

// patiently runs step again while it fails for a lock wait over
// lock_timeout, for up to lockPatience.
func patiently(ctx context.Context, step func() error) error {
	deadline := time.Now().Add(lockPatience)
	for {
		err := step()
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "55P03" {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("a lock it needs stayed taken for %s (a long transaction on the table? see pg_stat_activity), each wait bounded to %s so that registrations and sweeps do not queue behind it: run migrate again: %w",
				lockPatience, lockWait, err)
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(lockPause):
		}
	}
}

func currentSchema(ctx context.Context, conn *pgx.Conn) (string, error) {
	var name *string
	if err := conn.QueryRow(ctx, "SELECT current_schema()").Scan(&name); err != nil {
		return "", fmt.Errorf("read current schema: %w", err)
	}
	if name == nil {
		return "", fmt.Errorf("no schema on the search_path exists: create it or fix search_path")
	}
	return *name, nil
}

// safeSearchPathSQL sets search_path to pg_catalog alone (pg_temp searched
// last, never for functions) until the transaction ends. A privileged user
// (the RDS master user) that runs SQL with the archive's schema on its
// search_path would resolve a function, operator or aggregate the owner role
// created there when it matches better than pg_catalog's (format(text,
// text) over format(text, VARIADIC "any")): code the owner wrote, run with
// the privileged user's rights.
const safeSearchPathSQL = "pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true)"

// SafeSearchPath sets search_path to pg_catalog alone for the rest of tx
// (see safeSearchPathSQL): for a privileged user's statements, which then
// name the archive's objects with their schema.
func SafeSearchPath(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, "SELECT "+safeSearchPathSQL); err != nil {
		return fmt.Errorf("set search_path: %w", err)
	}
	return nil
}

// ensureRoles creates the least-privilege roles and their grants when the
// connecting user may create roles, and logs why it skipped them otherwise.
// It returns the roles it created and whether it applied the grants.
func ensureRoles(ctx context.Context, conn *pgx.Conn, schemaName string, logger *slog.Logger) ([]string, bool, error) {
	created := []string{}
	var mayCreate bool
	err := conn.QueryRow(ctx,
		"SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user").Scan(&mayCreate)
	if err != nil {
		return created, false, fmt.Errorf("check role privileges: %w", err)
	}
	roles := []string{OwnerRole, SweeperRole, ReaderRole, WriterRole}
	if !mayCreate {
		logger.WarnContext(ctx, "skipping least-privilege roles: the connecting user may not create roles", "roles", roles)
		return created, false, nil
	}
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		// The connecting user may be privileged (the RDS master user), and
		// idempotency_owner may create functions in the archive's schema:
		// every name of this transaction resolves in pg_catalog alone (see
		// SafeSearchPath), and roles.sql reads the archive's schema from
		// idemarchive.schema.
		if _, err := tx.Exec(ctx, "SELECT pg_catalog.set_config('idemarchive.schema', $1, true), pg_catalog.set_config('lock_timeout', $2, true), "+safeSearchPathSQL,
			schemaName, lockTimeout); err != nil {
			return err
		}
		// Role DDL is cluster-wide and races between concurrent migrators
		// ("tuple concurrently updated"), so serialize it.
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtextextended('idempotency_archive roles', 0))"); err != nil {
			return err
		}
		var existing []string
		if err := tx.QueryRow(ctx, "SELECT coalesce(array_agg(rolname::text), '{}') FROM pg_roles WHERE rolname = ANY($1)", roles).Scan(&existing); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, rolesSQL); err != nil {
			return err
		}
		for _, r := range roles {
			if !slices.Contains(existing, r) {
				created = append(created, r)
			}
		}
		return nil
	})
	if err != nil {
		return []string{}, false, fmt.Errorf("create roles and grants: %w", err)
	}
	return created, true, nil
}
