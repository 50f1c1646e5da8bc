// Package database opens pgx connection pools and runs transactions for the
// other packages of this module. It is the one place that knows how a
// connection is configured, so that the sweeper, the partition manager and the
// lookup all talk to PostgreSQL the same way.
package database

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Config configures a connection pool.
type Config struct {
	// URL is a PostgreSQL connection string (postgres://user@host:5432/db?...).
	// Required. A search_path query parameter selects the schema.
	URL string
	// MaxConns caps the pool. Default 4.
	MaxConns int32
	// ExecMode selects how statements are sent. "cache_statement" (default)
	// uses named prepared statements; "exec" and "simple_protocol" prepare
	// nothing server-side, which keeps RDS Proxy from pinning sessions.
	ExecMode string
}

var execModes = map[string]pgx.QueryExecMode{
	"cache_statement": pgx.QueryExecModeCacheStatement,
	"cache_describe":  pgx.QueryExecModeCacheDescribe,
	"describe_exec":   pgx.QueryExecModeDescribeExec,
	"exec":            pgx.QueryExecModeExec,
	"simple_protocol": pgx.QueryExecModeSimpleProtocol,
}

// PoolConfig validates c and returns the pgxpool configuration it describes.
// Errors never include the connection string, which may hold a password.
func (c Config) PoolConfig() (*pgxpool.Config, error) {
	if c.URL == "" {
		return nil, errors.New("database URL is empty: set DATABASE_URL")
	}
	cfg, err := pgxpool.ParseConfig(c.URL)
	if err != nil {
		return nil, errors.New("database URL is not a valid PostgreSQL connection string")
	}
	if c.MaxConns < 0 {
		return nil, fmt.Errorf("database max connections must be positive, got %d", c.MaxConns)
	}
	if c.MaxConns == 0 {
		c.MaxConns = 4
	}
	cfg.MaxConns = c.MaxConns
	if c.ExecMode != "" {
		mode, ok := execModes[strings.ToLower(c.ExecMode)]
		if !ok {
			return nil, fmt.Errorf("unknown statement execution mode %q (want cache_statement, cache_describe, describe_exec, exec or simple_protocol)", c.ExecMode)
		}
		cfg.ConnConfig.DefaultQueryExecMode = mode
	}
	return cfg, nil
}

// Open validates c and creates a pool. It does not connect: the first query does.
func Open(ctx context.Context, c Config) (*pgxpool.Pool, error) {
	cfg, err := c.PoolConfig()
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("create connection pool: %w", err)
	}
	return pool, nil
}

// Beginner is what InTx needs: a pool, a connection or a transaction.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// InTx runs fn in a transaction: commit when fn returns nil, roll back otherwise.
// settings are applied with SET LOCAL semantics (set_config(..., true)) before
// fn runs, in one round trip, so they end with the transaction.
func InTx(ctx context.Context, db Beginner, settings map[string]string, fn func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if len(settings) > 0 {
			names := make([]string, 0, len(settings))
			values := make([]string, 0, len(settings))
			for k, v := range settings {
				names = append(names, k)
				values = append(values, v)
			}
			const setLocal = `SELECT set_config(name, value, true) FROM unnest($1::text[], $2::text[]) AS s(name, value)`
			if _, err := tx.Exec(ctx, setLocal, names, values); err != nil {
				return fmt.Errorf("set transaction settings: %w", err)
			}
		}
		return fn(tx)
	})
}

// Timeouts returns the settings that bound lock waits and statements, for InTx.
func Timeouts(lock, statement time.Duration) map[string]string {
	return map[string]string{
		"lock_timeout":      fmt.Sprintf("%dms", lock.Milliseconds()),
		"statement_timeout": fmt.Sprintf("%dms", statement.Milliseconds()),
	}
}

// SQLState returns the SQLSTATE of a PostgreSQL error, or "" for other errors.
func SQLState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// SQLSTATE codes this module reacts to.
const (
	CodeCheckViolation        = "23514" // also raised for "no partition of relation found for row"
	CodeInsufficientPrivilege = "42501"
	CodeLockNotAvailable      = "55P03" // lock_timeout expired
	CodeQueryCanceled         = "57014" // statement_timeout expired
	CodeUndefinedTable        = "42P01"
)
