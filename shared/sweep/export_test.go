package sweep

import (
	"context"
	"time"
)

// SetSleep replaces the pause between batches, so tests can see it.
func (s *Sweeper) SetSleep(f func(context.Context, time.Duration) error) { s.sleep = f }
