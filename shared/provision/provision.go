// Package provision brings a database to the state the functions need, in
// one idempotent call that a deploy makes every time: the schema migrated and
// its least-privilege roles granted (package schema), one login user per
// function with the matching role, and the archive partitions created
// (package partition).
//
//	res, err := provision.Run(ctx, pool, provision.Config{
//		Users: provision.Users{Sweeper: "idemarchive_sweeper", Reader: "idemarchive_reader", Owner: "idemarchive_owner"},
//	}, logger, emitter)
//
// Login users are created WITH LOGIN and no password: on RDS they sign in with
// IAM authentication (through RDS Proxy), for which PostgreSQL needs them to
// be members of rds_iam. That role exists only on RDS and Aurora, so the grant
// is made where it exists and skipped (and reported) elsewhere, such as a
// local PostgreSQL, where the users then get no way to sign in until a
// password is set by hand.
package provision

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemarchive/idemarchive/shared/database"
	"github.com/idemarchive/idemarchive/shared/metrics"
	"github.com/idemarchive/idemarchive/shared/partition"
	"github.com/idemarchive/idemarchive/shared/schema"
)

// IAMRole is the role RDS and Aurora require of users that sign in with IAM
// authentication tokens.
const IAMRole = "rds_iam"

// Users names the login users to create, one per function. An empty name
// creates no user for that function.
type Users struct {
	// Sweeper is granted idempotency_sweeper (the sweep function).
	Sweeper string `json:"sweeper,omitempty"`
	// Reader is granted idempotency_reader (the lookup function).
	Reader string `json:"reader,omitempty"`
	// Owner is granted idempotency_owner (the partitions function).
	Owner string `json:"owner,omitempty"`
	// Writer is granted idempotency_writer: the API services whose
	// Postgres live store registers and completes keys.
	Writer string `json:"writer,omitempty"`
}

// Config configures Run.
type Config struct {
	// Users are the login users to create and grant. Default none.
	Users Users
	// Previous are the users the last run named (an Update's old
	// properties). A name that held another function's role there loses
	// it: swapping two functions' users must not leave either with the
	// other's rights. Roles granted by hand are left alone.
	Previous Users
	// Partitions configures the partition run; see partition.Config.
	Partitions partition.Config
}

// Result reports what Run did.
type Result struct {
	Schema     schema.Result    `json:"schema"`
	Users      []User           `json:"users"`
	Partitions partition.Result `json:"partitions"`
}

// User is one login user and what it was granted.
type User struct {
	Name    string `json:"name"`
	Role    string `json:"role"`
	Created bool   `json:"created"`
	// IAM reports whether the user was granted rds_iam (false where the role
	// does not exist).
	IAM bool `json:"iam"`
}

// ErrInvalidUser is wrapped by Run's error for a user name it refuses.
var ErrInvalidUser = errors.New("invalid database user name")

// userName is what Run accepts as a user name: a lowercase PostgreSQL
// identifier that needs no quoting, short of the 63-byte limit, so that the
// name IAM policies carry (rds-db:connect .../dbuser:id/NAME) is the name
// PostgreSQL stores.
var userName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// Validate checks the user names before anything runs.
func (u Users) Validate() error {
	seen := map[string]bool{}
	for _, name := range []string{u.Sweeper, u.Reader, u.Owner, u.Writer} {
		switch {
		case name == "":
			continue
		case !userName.MatchString(name):
			return fmt.Errorf("%w %q: use lowercase letters, digits and _, starting with a letter or _", ErrInvalidUser, name)
		case name == schema.OwnerRole || name == schema.SweeperRole || name == schema.ReaderRole || name == schema.WriterRole || name == IAMRole:
			return fmt.Errorf("%w %q: that is a group role, not a login user", ErrInvalidUser, name)
		case len(name) >= 3 && (name[:3] == "pg_" || name[:3] == "rds"):
			return fmt.Errorf("%w %q: names starting pg_ or rds are reserved", ErrInvalidUser, name)
		case seen[name]:
			return fmt.Errorf("%w %q: each function needs its own user", ErrInvalidUser, name)
		}
		seen[name] = true
	}
	return nil
}

// Run migrates, creates the users and their grants, and runs the partition
// manager, in that order, stopping at the first failure. Safe to run again
// and concurrently: every step is idempotent, and runs on one schema are
// serialized by an advisory lock held for the whole run (two copies of one
// deploy's event at once). The connecting user must be allowed to create
// roles (superuser, or CREATEROLE such as the RDS master user) when Users
// names any.
//
// The migrations and the partition run sign in as Users.Owner where that
// user exists: the connecting user is privileged, and both run code the
// owner role may change (tern's statements resolve names through the
// archive's schema, migrations and partition runs fire the triggers on the
// owner's tables and call its functions), which must never run with those
// privileges. SET ROLE would not contain it (RESET ROLE undoes it). The
// connecting user applies only the grants and the users, resolving every
// name in pg_catalog. Where the owner user cannot sign in with the pool's
// configuration and the server has no rds_iam role (a local PostgreSQL with
// passwords), both fall back to the connecting user with a warning; on RDS
// the run fails instead. On the first deploy the owner user does not exist
// yet, and the migrations run as the connecting user.
func Run(ctx context.Context, pool *pgxpool.Pool, cfg Config, logger *slog.Logger, emitter *metrics.Emitter) (Result, error) {
	res := Result{Users: []User{}}
	if err := cfg.Users.Validate(); err != nil {
		return res, err
	}
	if _, err := partition.NewManager(pool, cfg.Partitions, emitter); err != nil {
		return res, err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return res, fmt.Errorf("connect: %w", err)
	}
	defer conn.Release()
	unlock, err := lockRun(ctx, conn)
	if err != nil {
		return res, err
	}
	defer unlock()

	res.Schema, err = migrate(ctx, pool, conn, cfg, logger)
	switch {
	case err == nil:
		res.Schema.RolesCreated, res.Schema.GrantsApplied, err = schema.EnsureRoles(ctx, conn.Conn(), logger)
		if err == nil {
			res.Users, err = ensureUsers(ctx, conn.Conn(), cfg.Users, cfg.Previous, res.Schema.GrantsApplied, logger)
		}
	case errors.Is(err, schema.ErrSchemaAhead):
		// A rollback over a deploy that migrated further: the schema stays
		// as it is, but the functions run as this deploy's users again, so
		// each must hold its own role and no other (an Update that swapped
		// two names is undone). The partitions are left to the newer
		// schema's runs.
		ahead := err
		var may bool
		if may, err = mayCreateRoles(ctx, conn.Conn()); err == nil {
			res.Users, err = ensureUsers(ctx, conn.Conn(), cfg.Users, cfg.Previous, may, logger)
		}
		if err != nil {
			return res, err
		}
		return res, fmt.Errorf("%w (users provisioned, partitions left as they are)", ahead)
	}
	if err != nil {
		return res, err
	}
	iam, err := serverHasIAM(ctx, conn)
	if err != nil {
		return res, err
	}
	runPool, err := ownerPool(ctx, pool, cfg.Users.Owner, iam, logger)
	if err != nil {
		return res, fmt.Errorf("partition run: %w", err)
	}
	if runPool != pool {
		defer closeWithin(runPool, cleanupWait)
	} else if pool.Config().MaxConns < 2 {
		// The run's lock holds the pool's one connection: the partition
		// run would wait for another until the deadline.
		return res, errors.New("partition run: the run's lock holds the pool's only connection: set DATABASE_MAX_CONNS to 2 or more")
	}
	parts, err := partition.NewManager(runPool, cfg.Partitions, emitter)
	if err != nil {
		return res, err
	}
	if res.Partitions, err = parts.Run(ctx, false); err != nil {
		return res, fmt.Errorf("create partitions: %w", err)
	}
	return res, nil
}

// migrate applies the pending migrations, as the owner user where it is a
// member of the owner role (see Run), else over conn.
//
// Where the owner role exists but the named user is not yet a usable member
// of it (an Update that renames OwnerUser or swaps it with another
// function's, a Create over a database an earlier stack left), the role's
// members (the previous owner user among them) may have planted code that
// tern and the migrations would run: the users are provisioned first, so
// that the name gets its role (and the previous name loses it) and the
// migrations run as it, and a name ensureUsers refuses (a privileged user)
// fails the deploy before any migration runs. The migrations run as conn's
// user only where the owner role may not create objects in the schema yet
// (the first deploy: no member can have put anything there) or no owner
// user is named.
func migrate(ctx context.Context, pool *pgxpool.Pool, conn *pgxpool.Conn, cfg Config, logger *slog.Logger) (schema.Result, error) {
	owner := cfg.Users.Owner
	if owner == "" {
		return schema.ApplyMigrations(ctx, conn.Conn(), logger)
	}
	st, err := lookUpOwner(ctx, conn, owner)
	if err != nil {
		return schema.Result{}, err
	}
	if !st.member && st.inSchema {
		may, err := mayCreateRoles(ctx, conn.Conn())
		if err != nil {
			return schema.Result{}, err
		}
		if _, err := ensureUsers(ctx, conn.Conn(), cfg.Users, cfg.Previous, may, logger); err != nil {
			return schema.Result{}, err
		}
		if st, err = lookUpOwner(ctx, conn, owner); err != nil {
			return schema.Result{}, err
		}
		if !st.member {
			// Never fall back to conn's user here: the owner role's
			// members may have planted code in the schema.
			return schema.Result{}, fmt.Errorf("apply migrations: user %s still may not SET ROLE %s after the users were provisioned (a membership with SET FALSE another role granted?): the migrations would run as the migrating user, which must never run code the owner role's members may have planted; give it the role with SET TRUE, or name another OwnerUser",
				owner, schema.OwnerRole)
		}
	}
	if !st.inSchema {
		return schema.ApplyMigrations(ctx, conn.Conn(), logger)
	}
	iam := st.iam
	migrator, err := ownerPool(ctx, pool, owner, iam, logger)
	if err != nil {
		return schema.Result{}, fmt.Errorf("apply migrations: %w", err)
	}
	if migrator == pool {
		return schema.ApplyMigrations(ctx, conn.Conn(), logger)
	}
	defer closeWithin(migrator, cleanupWait)
	// tern's version table may still be the migrating user's (made by the
	// first deploy, before a release whose grants give it to the owner).
	if err := giveVersionTable(ctx, conn); err != nil {
		return schema.Result{}, err
	}
	mc, err := migrator.Acquire(ctx)
	if err != nil {
		return schema.Result{}, fmt.Errorf("apply migrations as %s: %w", owner, err)
	}
	defer mc.Release()
	return schema.ApplyMigrations(ctx, mc.Conn(), logger)
}

// ownerState is what migrate needs to know of the owner user.
type ownerState struct {
	member bool // a login, unprivileged member of the owner role
	// inSchema: the owner role exists and may create objects in the
	// archive's schema (earlier grants), so its members may have.
	inSchema bool
	iam      bool // the server has rds_iam
}

func lookUpOwner(ctx context.Context, conn *pgxpool.Conn, owner string) (ownerState, error) {
	var st ownerState
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		var current pgtype.Text
		if err := tx.QueryRow(ctx, "SELECT pg_catalog.current_schema()").Scan(&current); err != nil {
			return err
		}
		if err := schema.SafeSearchPath(ctx, tx); err != nil {
			return err
		}
		var exists, canLogin, privileged bool
		err := tx.QueryRow(ctx, privilegedSQL, owner).Scan(&exists, &canLogin, &privileged)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		err = tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)
		                               AND EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $3)
		                               AND has_schema_privilege($1, $3, 'CREATE'),
		                               EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $2)`,
			schema.OwnerRole, IAMRole, current.String).Scan(&st.inSchema, &st.iam)
		if err != nil || !exists || !canLogin || privileged || !st.inSchema {
			return err
		}
		return tx.QueryRow(ctx, maySetRoleSQL, owner, schema.OwnerRole).Scan(&st.member)
	})
	if err != nil {
		return st, fmt.Errorf("look up user %s: %w", owner, err)
	}
	return st, nil
}

// maySetRoleSQL says whether user $1 may SET ROLE to $2, as ownerPool's
// connections do: on PostgreSQL 16 and later a membership's SET option
// says (a membership with INHERIT alone gives none), before any member may.
// A user that may not is provisioned before the migrations run (see
// migrate), where grantRole gives it what it lacks.
const maySetRoleSQL = "SELECT " + maySetRole

// maySetRole is maySetRoleSQL's expression, which holdsRoleSQL shares.
const maySetRole = `CASE WHEN current_setting('server_version_num')::int >= 160000 THEN pg_has_role($1, $2, 'SET')
            ELSE pg_has_role($1, $2, 'MEMBER') END`

// giveVersionTable gives tern's version table to the owner role where it
// exists and is another's.
func giveVersionTable(ctx context.Context, conn *pgxpool.Conn) error {
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		var schemaName pgtype.Text
		if err := tx.QueryRow(ctx, "SELECT pg_catalog.current_schema()").Scan(&schemaName); err != nil {
			return fmt.Errorf("read current schema: %w", err)
		}
		if err := schema.SafeSearchPath(ctx, tx); err != nil {
			return err
		}
		table := pgx.Identifier{schemaName.String, schema.VersionTable}.Sanitize()
		var other bool
		err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		                                          WHERE n.nspname = $1 AND c.relname = $2 AND c.relowner <> $3::regrole)`,
			schemaName.String, schema.VersionTable, schema.OwnerRole).Scan(&other)
		if err != nil || !other {
			return err
		}
		if _, err := tx.Exec(ctx, "ALTER TABLE "+table+" OWNER TO "+pgx.Identifier{schema.OwnerRole}.Sanitize()); err != nil {
			return fmt.Errorf("give %s to %s: %w", table, schema.OwnerRole, err)
		}
		return nil
	})
}

// serverHasIAM says whether the server has the rds_iam role (RDS, Aurora).
func serverHasIAM(ctx context.Context, conn *pgxpool.Conn) (bool, error) {
	var iam bool
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if err := schema.SafeSearchPath(ctx, tx); err != nil {
			return err
		}
		return tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)", IAMRole).Scan(&iam)
	})
	if err != nil {
		return false, fmt.Errorf("look for %s: %w", IAMRole, err)
	}
	return iam, nil
}

// lockRun takes the session advisory lock that serializes runs on conn's
// schema, and returns its release. A lock that cannot be released closes
// the connection, which releases it.
func lockRun(ctx context.Context, conn *pgxpool.Conn) (func(), error) {
	// A NULL schema (none on the search_path exists) is reported by the
	// migration that follows; the lock is then one for all such runs.
	var current pgtype.Text
	if err := conn.QueryRow(ctx, "SELECT pg_catalog.current_schema()").Scan(&current); err != nil {
		return nil, fmt.Errorf("lock the run: %w", err)
	}
	key := "idempotency_archive provision " + pgx.Identifier{current.String}.Sanitize()
	if _, err := conn.Exec(ctx, "SELECT pg_catalog.pg_advisory_lock(pg_catalog.hashtextextended($1::pg_catalog.text, 0::pg_catalog.int8))", key); err != nil {
		return nil, fmt.Errorf("lock the run (another deploy's run holds the lock): %w", err)
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupWait)
		defer cancel()
		if _, err := conn.Exec(ctx, "SELECT pg_catalog.pg_advisory_unlock(pg_catalog.hashtextextended($1::pg_catalog.text, 0::pg_catalog.int8))", key); err != nil {
			_ = conn.Conn().Close(ctx)
		}
	}, nil
}

// cleanupWait bounds each step of a run's cleanup (releasing its lock,
// closing the owner user's pool), which runs once the caller's context may
// have ended: a database that stopped answering would otherwise hold each
// for pgx's own waits (15 s to close a connection), past the time the
// migrate function keeps to answer CloudFormation. A lock not released in
// time goes with its connection, closed; a pool not closed in time closes
// on its own afterwards.
const cleanupWait = 2 * time.Second

// closeWithin closes p, waiting at most d for it.
func closeWithin(p *pgxpool.Pool, d time.Duration) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.Close()
	}()
	select {
	case <-done:
	case <-time.After(d):
	}
}

// ownerSignInAttempts and ownerSignInPause bound the wait for the owner
// user's first sign-in: on RDS its rds_iam grant and the function's
// rds-db:connect permission may take a few seconds to apply.
const ownerSignInAttempts = 4

var ownerSignInPause = 5 * time.Second // a variable for its test

// ownerPool returns a pool of pool's configuration that signs in as owner
// and acts as the owner role (SET ROLE, so that what it creates is the
// role's, not the user's), or pool itself when owner is empty, or when
// owner cannot sign in and iam is false (no rds_iam on the server: the user
// was made without a way to sign in), with a warning. The caller closes a
// pool it did not pass.
func ownerPool(ctx context.Context, pool *pgxpool.Pool, owner string, iam bool, logger *slog.Logger) (*pgxpool.Pool, error) {
	if owner == "" {
		return pool, nil
	}
	cfg := pool.Config() // a copy
	cfg.ConnConfig.User, cfg.ConnConfig.Password = owner, ""
	cfg.MinConns = 0
	setup := cfg.AfterConnect
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		if setup != nil {
			if err := setup(ctx, c); err != nil {
				return err
			}
		}
		_, err := c.Exec(ctx, "SET ROLE "+pgx.Identifier{schema.OwnerRole}.Sanitize())
		return err
	}
	var err error
	for attempt := 1; ; attempt++ {
		var p *pgxpool.Pool
		if p, err = signIn(ctx, cfg, owner); err == nil {
			return p, nil
		}
		if !iam || attempt == ownerSignInAttempts || !errors.Is(err, errSignIn) {
			break
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(ownerSignInPause):
		}
	}
	if iam || !errors.Is(err, errSignIn) {
		return nil, fmt.Errorf("sign in as %s: %w", owner, err)
	}
	logger.WarnContext(ctx, "the migrating user runs the owner role's code: the owner user cannot sign in here, so code the owner role may change runs with the migrating user's privileges",
		"owner_user", owner, "error", err)
	return pool, nil
}

// errSignIn marks a sign-in the server refused, or one as another user
// (credentials from a secret name their own user).
var errSignIn = errors.New("cannot sign in as the owner user")

func signIn(ctx context.Context, cfg *pgxpool.Config, user string) (*pgxpool.Pool, error) {
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	var who string
	err = p.QueryRow(ctx, "SELECT session_user").Scan(&who)
	switch {
	case err != nil && strings.HasPrefix(database.SQLState(err), "28"):
		err = fmt.Errorf("%w: %w", errSignIn, err)
	case err == nil && who != user:
		err = fmt.Errorf("%w: the pool's credentials sign in as %s", errSignIn, who)
	}
	if err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// privilegedSQL looks up a user: whether it exists, may log in, and is
// privileged: the migrating user, or a role that reaches, through any chain
// of memberships (pg_has_role MEMBER is transitive and includes the role
// itself), a role with SUPERUSER, CREATEROLE, BYPASSRLS or REPLICATION, or a
// predefined role that reads or writes everything or runs server programs.
const privilegedSQL = `
SELECT true, r.rolcanlogin,
       r.rolname IN (current_user, session_user)
       OR EXISTS (SELECT 1 FROM pg_roles p
                   WHERE pg_has_role(r.oid, p.oid, 'MEMBER')
                     AND (p.rolsuper OR p.rolcreaterole OR p.rolbypassrls OR p.rolreplication
                          OR p.rolname IN ('pg_execute_server_program', 'pg_read_server_files', 'pg_write_server_files',
                                           'pg_read_all_data', 'pg_write_all_data', 'rds_superuser')))
  FROM pg_roles r WHERE r.rolname = $1`

// mayCreateRoles says whether the connecting user may create roles and
// grant them (superuser or CREATEROLE), as ensureUsers needs.
func mayCreateRoles(ctx context.Context, conn *pgx.Conn) (bool, error) {
	var may bool
	if err := conn.QueryRow(ctx, "SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user").Scan(&may); err != nil {
		return false, fmt.Errorf("check role privileges: %w", err)
	}
	return may, nil
}

// A function's user (sweeper, lookup, partitions) holds its function's role
// and no other of the project's: revokeOthers takes the others away. Were a
// name used by one function and later given to another (swapped names, a
// rename that frees a name a later deploy reuses), it would otherwise keep
// the first function's rights: the lookup function's user could delete live
// keys. The API services' user (WriterUser) is the exception: an operator
// may grant it more (idempotency_reader, as an API that reads the archive
// with its live store's user needs), so only the role the previous deploy
// gave its name, when that was another, is revoked (revokeMoved).
//
// A name the previous deploy gave a function and this one gives no one
// loses that role (revokeDropped), unless it is the migrating user or a
// privileged role (the properties of a failed Update, which named one and
// was refused, come back as the previous ones in its rollback), and keeps
// its LOGIN and rds_iam, which the deploy may not have given. A dropped
// WriterUser keeps its role: the live API may still connect as it.
//
// Each revoke is checked: on PostgreSQL 16 and later it removes only the
// migrating user's own grant, and a membership another role granted would
// stay.

// projectRoles are the group roles the deploy grants.
var projectRoles = []string{schema.OwnerRole, schema.SweeperRole, schema.ReaderRole, schema.WriterRole}

// revoke revokes role from name where name is a direct member, and checks
// that the membership is gone.
func revoke(ctx context.Context, tx pgx.Tx, role, name, why string) error {
	var member bool
	if err := tx.QueryRow(ctx, directMemberSQL, role, name).Scan(&member); err != nil {
		return fmt.Errorf("look up %s's roles: %w", name, err)
	}
	if !member {
		return nil
	}
	// Read before the REVOKE, whose failure ends the transaction.
	var grantors, r, n, me string
	if err := tx.QueryRow(ctx, grantorsSQL, role, name).Scan(&grantors, &r, &n, &me); err != nil {
		return fmt.Errorf("look up who granted %s to %s: %w", role, name, err)
	}
	byGrantor := fmt.Sprintf("as that grantor or a superuser, run REVOKE %s FROM %s GRANTED BY <grantor>, or keep the name where it was", r, n)
	if _, err := tx.Exec(ctx, "REVOKE "+pgx.Identifier{role}.Sanitize()+" FROM "+pgx.Identifier{name}.Sanitize()); err != nil {
		if database.SQLState(err) == database.CodeInsufficientPrivilege {
			return fmt.Errorf("revoke %s from %s, %s: the migrating user may not revoke that role: %s; or, granted by %s, %s: %w", role, name, why, adminRemedy(me), grantors, byGrantor, err)
		}
		return fmt.Errorf("revoke %s from %s, %s: %w", role, name, why, err)
	}
	if err := tx.QueryRow(ctx, directMemberSQL, role, name).Scan(&member); err != nil {
		return fmt.Errorf("look up %s's roles: %w", name, err)
	}
	if member {
		return fmt.Errorf("user %s is still a member of %s after REVOKE, %s: the membership left was granted by %s (since PostgreSQL 16 a REVOKE removes only the revoking user's own grant, "+
			"and a database upgraded from 15 records its older grants as the bootstrap superuser's); %s",
			name, role, why, grantors, byGrantor)
	}
	return nil
}

// grantorsSQL lists who granted role $1 to $2 directly, and quotes both
// names and the migrating user's, as SQL an operator can paste.
const grantorsSQL = `
SELECT coalesce(string_agg(DISTINCT quote_ident(g.rolname), ', '), 'another role'), quote_ident($1), quote_ident($2), quote_ident(current_user)
  FROM pg_auth_members m
  JOIN pg_roles r ON r.oid = m.roleid
  JOIN pg_roles u ON u.oid = m.member
  LEFT JOIN pg_roles g ON g.oid = m.grantor
 WHERE r.rolname = $1 AND u.rolname = $2`

// revokeOthers revokes from a function's user every project role but its
// own, and refuses one it still holds through another role.
func revokeOthers(ctx context.Context, tx pgx.Tx, u User) error {
	var others []string
	for _, role := range projectRoles {
		if role != u.Role {
			others = append(others, role)
			if err := revoke(ctx, tx, role, u.Name, "a function's user holds its function's role alone"); err != nil {
				return err
			}
		}
	}
	return refuseHeldThrough(ctx, tx, u, others)
}

// refuseHeldThrough refuses user u that holds one of others through other
// roles (an operator's group that holds the owner role, or its own role
// granted another): that gives it the role's privileges as a direct grant
// does, and the deploy cannot take them away without taking them from the
// chain's other members too.
func refuseHeldThrough(ctx context.Context, tx pgx.Tx, u User, others []string) error {
	chain, err := heldThrough(ctx, tx, u.Name, others)
	if err != nil || chain == nil {
		return err
	}
	// The link to break (REVOKE chain[k] FROM chain[k-1]): the one after
	// the user's own role where the chain passes it (a project role must
	// hold no other), else the user's first.
	k := 1
	if i := slices.Index(chain, u.Role); i > 0 {
		k = i + 1
	}
	return fmt.Errorf("user %s holds %s through %s, with its privileges (a function's user holds its function's role alone): run REVOKE %s FROM %s, or give the function another user",
		u.Name, chain[len(chain)-1], strings.Join(chain[1:], " -> "), chain[k], chain[k-1])
}

// heldThrough returns the shortest chain of memberships by which user name
// holds one of roles (quoted names: the user's, then each role's), nil
// when it holds none. Only memberships that can pass privileges on count:
// on PostgreSQL 16 and later, one granted WITH INHERIT FALSE, SET FALSE and
// without ADMIN OPTION gives nothing.
func heldThrough(ctx context.Context, tx pgx.Tx, name string, roles []string) ([]string, error) {
	var user uint32
	var quoted string
	if err := tx.QueryRow(ctx, "SELECT oid, quote_ident(rolname) FROM pg_catalog.pg_roles WHERE rolname = $1", name).Scan(&user, &quoted); err != nil {
		return nil, fmt.Errorf("look up %s's roles: %w", name, err)
	}
	rows, err := tx.Query(ctx, membershipsSQL, user)
	if err != nil {
		return nil, fmt.Errorf("look up %s's roles: %w", name, err)
	}
	type edge struct {
		Member, Role uint32
		Quoted, Name string
	}
	edges, err := pgx.CollectRows(rows, pgx.RowToStructByPos[edge])
	if err != nil {
		return nil, fmt.Errorf("look up %s's roles: %w", name, err)
	}
	// Breadth first from the user: the first of roles reached ends a
	// shortest chain.
	type node struct {
		prev  int // index in reached; -1 for the user
		oid   uint32
		label string
	}
	reached := []node{{prev: -1, oid: user, label: quoted}}
	visited := map[uint32]bool{user: true}
	for i := 0; i < len(reached); i++ {
		for _, e := range edges {
			if e.Member != reached[i].oid || visited[e.Role] {
				continue
			}
			visited[e.Role] = true
			reached = append(reached, node{prev: i, oid: e.Role, label: e.Quoted})
			if slices.Contains(roles, e.Name) {
				var chain []string
				for j := len(reached) - 1; j >= 0; j = reached[j].prev {
					chain = append([]string{reached[j].label}, chain...)
				}
				return chain, nil
			}
		}
	}
	return nil, nil
}

// membershipsSQL lists the memberships reachable from role $1 (an oid),
// each once: the member's and the role's oids, the role's name quoted and
// as it is. Only those that can pass privileges on count (PostgreSQL 16
// added inherit_option and set_option; before it every membership could).
const membershipsSQL = `
WITH RECURSIVE edge AS (
    SELECT m.member, m.roleid
      FROM pg_catalog.pg_auth_members m
     WHERE coalesce((pg_catalog.to_jsonb(m) ->> 'inherit_option')::bool, true)
        OR coalesce((pg_catalog.to_jsonb(m) ->> 'set_option')::bool, true)
        OR m.admin_option
),
up (member, roleid) AS (
    SELECT e.member, e.roleid FROM edge e WHERE e.member = $1::oid
    UNION
    SELECT e.member, e.roleid FROM up JOIN edge e ON e.member = up.roleid
)
SELECT up.member, up.roleid, quote_ident(r.rolname), r.rolname::text
  FROM up JOIN pg_catalog.pg_roles r ON r.oid = up.roleid
 ORDER BY r.rolname`

// revokeMoved revokes from the API services' user the role the previous
// deploy gave its name, when that was another.
func revokeMoved(ctx context.Context, tx pgx.Tx, u User, previous Users) error {
	for _, old := range previous.roles() {
		if old.Name == u.Name && old.Role != u.Role {
			if err := revoke(ctx, tx, old.Role, u.Name, "whose name the previous deploy gave that role"); err != nil {
				return err
			}
		}
	}
	return nil
}

// revokeDropped revokes from a function's user that this deploy names no
// more the role the previous deploy gave it, unless it is the migrating user
// or a privileged role, or does not exist, or (where iam: RDS) does not hold
// rds_iam: no deploy made it. That is the rollback of an Update refused for
// naming such a user (refuseForeign): its "previous" properties are the
// refused ones, and a role an operator granted that user by hand stays. A
// user a deploy made before the server had rds_iam looks the same and
// keeps its role too; the warning names the role to revoke by hand.
func revokeDropped(ctx context.Context, tx pgx.Tx, old User, iam bool, logger *slog.Logger) error {
	var exists, canLogin, privileged bool
	err := tx.QueryRow(ctx, privilegedSQL, old.Name).Scan(&exists, &canLogin, &privileged)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil
	case err != nil:
		return fmt.Errorf("look up user %s: %w", old.Name, err)
	case privileged:
		logger.WarnContext(ctx, "the previous properties named the migrating user or a privileged role: its roles are left alone", "user", old.Name)
		return nil
	}
	if iam {
		has, err := holdsIAM(ctx, tx, old.Name)
		if err != nil {
			return err
		}
		if !has {
			logger.WarnContext(ctx, "the previous properties named a user that does not hold "+IAMRole+
				" (no deploy made it, or one made it before the server had "+IAMRole+"): its roles are left alone; revoke "+old.Role+" from it by hand if a deploy made it",
				"user", old.Name, "role", old.Role)
			return nil
		}
	}
	return revoke(ctx, tx, old.Role, old.Name, "whose name the previous deploy gave that role and this one gives no function")
}

// holdsIAM says whether user name holds rds_iam, directly or not: every
// user a deploy makes or adopts on a server with rds_iam does.
func holdsIAM(ctx context.Context, tx pgx.Tx, name string) (bool, error) {
	var has bool
	if err := tx.QueryRow(ctx, "SELECT pg_catalog.pg_has_role($1, '"+IAMRole+"', 'MEMBER')", name).Scan(&has); err != nil {
		return false, fmt.Errorf("look up %s's roles: %w", name, err)
	}
	return has, nil
}

// directMemberSQL says whether role $2 is a direct member of role $1.
const directMemberSQL = `
SELECT EXISTS (SELECT 1 FROM pg_auth_members m
                 JOIN pg_roles r ON r.oid = m.roleid
                 JOIN pg_roles u ON u.oid = m.member
                WHERE r.rolname = $1 AND u.rolname = $2)`

// refuseForeign refuses an existing user that does not hold rds_iam and
// that the previous deploy did not name: no deploy made it (every deploy
// on a server with rds_iam grants it to the users it makes or adopts). It
// belongs to someone else, maybe an application that signs in with a
// password, which rds_iam would turn off on RDS; one of the project's
// roles an operator granted it (an API's user reading the archive) does
// not make it the deploy's. An operator who means it for this function
// grants it rds_iam.
func refuseForeign(ctx context.Context, tx pgx.Tx, u User, previous Users) error {
	if slices.ContainsFunc(previous.roles(), func(old User) bool { return old.Name == u.Name }) {
		return nil
	}
	hasIAM, err := holdsIAM(ctx, tx, u.Name)
	if err != nil || hasIAM {
		return err
	}
	return fmt.Errorf("user %s exists and no deploy made it (it does not hold %s, and the previous deploy did not name it): granting it %s would turn off its password sign-in; choose another name, or, if it is meant for this function and signs in with IAM, run GRANT %s TO %s first",
		u.Name, IAMRole, IAMRole, IAMRole, pgx.Identifier{u.Name}.Sanitize())
}

// usableSQL reads what of user $1 can keep it from doing its function's
// work once it holds role $2: a connection limit of 0, not inheriting the
// role's privileges (NOINHERIT, on PostgreSQL 15 and earlier, where a
// grant has no INHERIT option), and default_transaction_read_only set on
// it (for all databases or this one).
const usableSQL = `
SELECT r.rolconnlimit = 0,
       pg_has_role(r.oid, $2, 'USAGE'),
       coalesce((SELECT array_agg(CASE s.setdatabase WHEN 0 THEN '' ELSE ' IN DATABASE ' || quote_ident(current_database()) END ORDER BY s.setdatabase)
                   FROM pg_db_role_setting s, unnest(s.setconfig) c
                  WHERE s.setrole = r.oid
                    AND s.setdatabase IN (0, (SELECT oid FROM pg_database WHERE datname = current_database()))
                    AND lower(split_part(c, '=', 1)) = 'default_transaction_read_only'
                    AND lower(trim(split_part(c, '=', 2))) IN ('t', 'tr', 'tru', 'true', 'y', 'ye', 'yes', 'on', '1')), '{}')
  FROM pg_roles r WHERE r.rolname = $1`

// usable fails, saying what to run, for an existing user that holds its
// role but could not do its function's work: a deploy that answered
// SUCCESS would leave every invocation failing. The owner user acts
// through SET ROLE, so it need not inherit; the reader only reads.
func usable(ctx context.Context, tx pgx.Tx, u User) error {
	var noConnections, inherits bool
	var readOnlyIn []string // "" for every database, " IN DATABASE d" for this one
	if err := tx.QueryRow(ctx, usableSQL, u.Name, u.Role).Scan(&noConnections, &inherits, &readOnlyIn); err != nil {
		return fmt.Errorf("look up user %s: %w", u.Name, err)
	}
	ident := pgx.Identifier{u.Name}.Sanitize()
	switch {
	case noConnections:
		return fmt.Errorf("user %s exists with CONNECTION LIMIT 0 and could never sign in: run ALTER ROLE %s CONNECTION LIMIT -1, or choose another name", u.Name, ident)
	case !inherits && u.Role != schema.OwnerRole:
		return fmt.Errorf("user %s exists with NOINHERIT and would not use %s's privileges: run ALTER ROLE %s INHERIT, or choose another name", u.Name, u.Role, ident)
	case len(readOnlyIn) > 0 && u.Role != schema.ReaderRole:
		var run []string
		for _, in := range readOnlyIn {
			run = append(run, "ALTER ROLE "+ident+in+" RESET default_transaction_read_only")
		}
		return fmt.Errorf("user %s has default_transaction_read_only set and could not write: run %s, or choose another name", u.Name, strings.Join(run, " and "))
	}
	return nil
}

// roles lists users' names with the role each is given.
func (u Users) roles() []User {
	return []User{{Name: u.Sweeper, Role: schema.SweeperRole}, {Name: u.Reader, Role: schema.ReaderRole}, {Name: u.Owner, Role: schema.OwnerRole},
		{Name: u.Writer, Role: schema.WriterRole}}
}

// ensureUsers creates each named user (WITH LOGIN, no password) and grants it
// its group role, and rds_iam where that exists, and revokes the roles a
// user may no longer hold (see revoke).
func ensureUsers(ctx context.Context, conn *pgx.Conn, users, previous Users, mayCreateRoles bool, logger *slog.Logger) ([]User, error) {
	wanted := users.roles()
	out := []User{}
	var dropped []User
	for _, old := range previous.roles() {
		if old.Name != "" && old.Role != schema.WriterRole && userName.MatchString(old.Name) &&
			!slices.ContainsFunc(wanted, func(u User) bool { return u.Name == old.Name }) {
			dropped = append(dropped, old)
		}
	}
	if users == (Users{}) && len(dropped) == 0 {
		return out, nil
	}
	if !mayCreateRoles {
		return out, errors.New("cannot create the functions' database users: the migrating user may not create roles (it needs CREATEROLE, as the RDS master user has)")
	}
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		// The migrating user is privileged: nothing the owner role may
		// create in the archive's schema can match a name here.
		if err := schema.SafeSearchPath(ctx, tx); err != nil {
			return err
		}
		// Role DDL is cluster-wide and races between concurrent deploys
		// ("tuple concurrently updated"): serialize it.
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtextextended('idempotency_archive users', 0))"); err != nil {
			return fmt.Errorf("lock: %w", err)
		}
		var iam bool
		if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)", IAMRole).Scan(&iam); err != nil {
			return fmt.Errorf("look for %s: %w", IAMRole, err)
		}
		for _, u := range wanted {
			if u.Name == "" {
				continue
			}
			ident := pgx.Identifier{u.Name}.Sanitize()
			var exists, canLogin bool
			var privileged bool
			err := tx.QueryRow(ctx, privilegedSQL, u.Name).Scan(&exists, &canLogin, &privileged)
			if err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("look up user %s: %w", u.Name, err)
			}
			if exists && privileged {
				// Granting rds_iam to such a user would turn off its
				// password sign-in (on RDS the master user would be locked
				// out), and a function must never run with its powers.
				return fmt.Errorf("user %s exists and is the migrating user or a privileged role: a function needs a user of its own; choose another name", u.Name)
			}
			if !exists {
				if _, err := tx.Exec(ctx, "CREATE ROLE "+ident+" LOGIN"); err != nil {
					return fmt.Errorf("create user %s: %w", u.Name, err)
				}
				u.Created = true
			} else if !canLogin {
				return fmt.Errorf("user %s exists but may not log in: it is not a user this deploy made; choose another name", u.Name)
			}
			if exists && iam {
				if err := refuseForeign(ctx, tx, u, previous); err != nil {
					return err
				}
			}
			if err := grantRole(ctx, tx, u); err != nil {
				return err
			}
			if exists {
				if err := usable(ctx, tx, u); err != nil {
					return err
				}
			}
			strip := revokeOthers
			if u.Role == schema.WriterRole {
				strip = func(ctx context.Context, tx pgx.Tx, u User) error { return revokeMoved(ctx, tx, u, previous) }
			}
			if err := strip(ctx, tx, u); err != nil {
				return err
			}
			if iam {
				// Granted unless it is a direct member already: RDS's IAM
				// sign-in is not known here to accept an indirect one.
				var member bool
				if err := tx.QueryRow(ctx, directMemberSQL, IAMRole, u.Name).Scan(&member); err != nil {
					return fmt.Errorf("look up %s's roles: %w", u.Name, err)
				}
				if !member {
					if _, err := tx.Exec(ctx, "GRANT "+IAMRole+" TO "+ident); err != nil {
						return fmt.Errorf("grant %s to %s: %w", IAMRole, u.Name, err)
					}
				}
				u.IAM = true
			}
			out = append(out, u)
		}
		for _, old := range dropped {
			if err := revokeDropped(ctx, tx, old, iam, logger); err != nil {
				return err
			}
		}
		if !iam && len(out) > 0 {
			logger.WarnContext(ctx, "no rds_iam role on this server (not RDS): the users were created without a way to sign in", "users", names(out))
		}
		return nil
	})
	if err != nil {
		if database.SQLState(err) == database.CodeInsufficientPrivilege {
			return nil, fmt.Errorf("create the functions' database users: the migrating user lacks a privilege: %w", err)
		}
		return nil, err
	}
	return out, nil
}

// holdsRoleSQL says whether user $1 has role $2's privileges (the
// functions use them by inheritance), and may SET ROLE to it where $3 (the
// owner user's, for ownerPool and ALTER ... OWNER TO; see maySetRoleSQL).
// And who the migrating user is, for the error a refused grant returns,
// and whether the server is PostgreSQL 16 or later.
const holdsRoleSQL = `
SELECT pg_has_role($1, $2, 'USAGE') AND (NOT $3 OR ` + maySetRole + `),
       quote_ident(current_user),
       current_setting('server_version_num')::int >= 160000`

// grantRole grants u its group role, unless it holds it already.
//
// Why skip a grant: since PostgreSQL 16 only a superuser or a holder of the
// role's ADMIN OPTION may grant it, even again; CREATEROLE no longer
// suffices. The migrating user holds it on the roles it created (roles.sql,
// on a first deploy on 16 or later), not on roles created by hand or by
// another user, nor on roles it created before an upgrade from 15. Users
// that hold their role already (each deploy's own grants, or an operator's)
// are left as they are, so such a deploy still succeeds; a user that needs
// a grant the migrating user may not make fails the deploy with what to run.
func grantRole(ctx context.Context, tx pgx.Tx, u User) error {
	var holds, v16 bool
	var me string
	if err := tx.QueryRow(ctx, holdsRoleSQL, u.Name, u.Role, u.Role == schema.OwnerRole).Scan(&holds, &me, &v16); err != nil {
		return fmt.Errorf("look up %s's roles: %w", u.Name, err)
	}
	if holds {
		return nil
	}
	options := ""
	if v16 {
		options = " WITH INHERIT TRUE"
		if u.Role == schema.OwnerRole {
			options += ", SET TRUE"
		}
	}
	// On 16 and later the options are stated: a GRANT without them leaves
	// a grant the same grantor made before (INHERIT FALSE or SET FALSE) as
	// it was, with a notice.
	if _, err := tx.Exec(ctx, "GRANT "+pgx.Identifier{u.Role}.Sanitize()+" TO "+pgx.Identifier{u.Name}.Sanitize()+options); err != nil {
		// 42501: no ADMIN OPTION on the role. XX000 "no possible grantors":
		// ADMIN held only through a membership whose privileges the
		// migrating user does not inherit.
		if code := database.SQLState(err); code != database.CodeInsufficientPrivilege && code != "XX000" {
			return fmt.Errorf("grant %s to %s: %w", u.Role, u.Name, err)
		}
		return fmt.Errorf("grant %s to %s: the migrating user may not grant that role: %s: %w", u.Role, u.Name, adminRemedy(me), err)
	}
	return nil
}

// adminRemedy says why the migrating user me may not grant the project's
// roles, and what gives it the right, as a role's creator holds it.
func adminRemedy(me string) string {
	return "since PostgreSQL 16 only a superuser or a holder of a role's ADMIN OPTION may grant it (its creator holds it; CREATEROLE no longer suffices), " +
		"and the migrating user did not create these roles on PostgreSQL 16 or later (another user did, or they predate an upgrade from 15); " +
		"as a superuser or a holder of their ADMIN OPTION, give it what their creator holds: GRANT " + strings.Join(projectRoles, ", ") + " TO " + me +
		" WITH ADMIN TRUE, INHERIT FALSE, SET FALSE"
}

func names(users []User) []string {
	out := make([]string, len(users))
	for i, u := range users {
		out[i] = u.Name
	}
	return out
}
