package database

import (
	"context"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Lazy creates a pool on first use and hands the same pool to every later
// caller: one pool per Lambda execution environment, created inside the first
// invocation (never during init, where a slow database would eat the init
// timeout) and reused by every invocation after it. A failed creation is
// retried by the next caller.
type Lazy struct {
	open func(context.Context) (*pgxpool.Pool, error)

	mu   sync.Mutex
	pool *pgxpool.Pool
}

// NewLazy returns a Lazy that calls open once it is first needed.
func NewLazy(open func(context.Context) (*pgxpool.Pool, error)) *Lazy {
	return &Lazy{open: open}
}

// Pool returns the pool, creating it if needed.
func (l *Lazy) Pool(ctx context.Context) (*pgxpool.Pool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.pool == nil {
		pool, err := l.open(ctx)
		if err != nil {
			return nil, err
		}
		l.pool = pool
	}
	return l.pool, nil
}

// Close closes the pool if it was created. Safe to call more than once.
func (l *Lazy) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.pool != nil {
		l.pool.Close()
		l.pool = nil
	}
}
