package database

import (
	"context"
	"sync"
)

// Lazy creates a value (a pool, or a service over it) on first use and hands
// the same value to every later caller: one per Lambda execution environment,
// created inside the first invocation (never during init, where a slow
// database would eat the init timeout) and reused by every invocation after
// it. A failed creation is retried by the next caller.
type Lazy[T any] struct {
	open  func(context.Context) (T, error)
	close func(T)

	mu    sync.Mutex
	value T
	ok    bool
}

// NewLazy returns a Lazy that calls open once it is first needed; close, when
// not nil, releases the value.
func NewLazy[T any](open func(context.Context) (T, error), close func(T)) *Lazy[T] {
	return &Lazy[T]{open: open, close: close}
}

// Get returns the value, creating it if needed.
func (l *Lazy[T]) Get(ctx context.Context) (T, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.ok {
		v, err := l.open(ctx)
		if err != nil {
			return v, err
		}
		l.value, l.ok = v, true
	}
	return l.value, nil
}

// Close releases the value if it was created. Safe to call more than once.
func (l *Lazy[T]) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ok && l.close != nil {
		l.close(l.value)
	}
	var zero T
	l.value, l.ok = zero, false
}
