package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/idemarchive/idemarchive/shared/fnenv"
	"github.com/idemarchive/idemarchive/shared/partition"
	"github.com/idemarchive/idemarchive/shared/settings"
	"github.com/idemarchive/idemarchive/shared/sweep"
)

type handler struct {
	env *fnenv.Env
	// conflicts outlives the invocation's Sweeper: after a batch met an
	// archive row that existed already, the next hour's invocations of this
	// warm function start with ON CONFLICT.
	conflicts sweep.ConflictMemory
	// batches outlives it too: after a batch ran past its statement
	// timeout, the next hour's invocations start at the size it came down
	// to, not at SWEEP_BATCH_SIZE again.
	batches sweep.BatchMemory
}

// newHandler is the function's handler as Lambda calls it: given the
// payload whole (fnenv.Raw), so that a payload holding more than one JSON
// value is refused, never read as its first.
func newHandler(env *fnenv.Env) interface {
	Invoke(context.Context, []byte) ([]byte, error)
} {
	return fnenv.Raw(env.Logger, (&handler{env: env}).Handle)
}

// options may override the configured sweep for one invocation.
type options struct {
	BatchSize   *int            `json:"batch_size,omitempty"`
	Pause       *string         `json:"pause,omitempty"`
	PauseRatio  json.RawMessage `json:"pause_ratio,omitempty"`
	MaxDuration *string         `json:"max_duration,omitempty"`
}

// Handle runs sweep batches until drained or until the remaining invocation
// time falls under the deadline margin, then returns the run's summary. Each
// batch is its own transaction, so a timeout never leaves a half-moved batch.
//
// An invocation that could not start a single batch while expired rows wait
// (a function timeout at or under SWEEP_DEADLINE_MARGIN) returns an error, so
// Lambda counts it in the function's Errors and the alarms see it, and logs a
// line that names the settings to change.
func (h *handler) Handle(ctx context.Context, payload json.RawMessage) (sweep.Result, error) {
	log := h.env.RequestLogger(ctx)
	cfg := h.env.Settings.Sweep
	var opts options
	if err := fnenv.DecodeInput(payload, &opts); err != nil {
		return sweep.Result{}, err
	}
	if opts.BatchSize != nil {
		if *opts.BatchSize < sweep.MinBatchSize || *opts.BatchSize > sweep.MaxBatchSize {
			return sweep.Result{}, fmt.Errorf("invalid options: batch_size must be between %d and %d, got %d", sweep.MinBatchSize, sweep.MaxBatchSize, *opts.BatchSize)
		}
		cfg.BatchSize = *opts.BatchSize
	}
	var err error
	if cfg.Pause, err = durationOption("pause", opts.Pause, cfg.Pause); err != nil {
		return sweep.Result{}, err
	}
	if len(opts.PauseRatio) > 0 && string(opts.PauseRatio) != "null" {
		// A JSON number read as the variable is (settings.ParseRatio): 1e-400,
		// which encoding/json would read as 0, is refused; the range is
		// sweep.New's to check.
		if opts.PauseRatio[0] == '"' {
			return sweep.Result{}, fmt.Errorf("invalid options: pause_ratio must be a number, not a string: %s", opts.PauseRatio)
		}
		if cfg.PauseRatio, err = settings.ParseRatio(string(opts.PauseRatio)); err != nil {
			return sweep.Result{}, fmt.Errorf("invalid options: pause_ratio %w", err)
		}
	}
	if cfg.MaxDuration, err = durationOption("max_duration", opts.MaxDuration, cfg.MaxDuration); err != nil {
		return sweep.Result{}, err
	}
	if opts.MaxDuration != nil && cfg.MaxDuration == 0 {
		// sweep.Config reads 0 as no limit: a max_duration of "0s" given
		// here would run until drained, the opposite of what it says.
		return sweep.Result{}, fmt.Errorf("invalid options: max_duration must be more than 0, got %q: leave it out for no limit but the invocation's deadline", *opts.MaxDuration)
	}

	cfg.Conflicts = &h.conflicts
	cfg.Batches = &h.batches

	pool, err := h.env.DB.Get(ctx)
	if err != nil {
		return sweep.Result{}, err
	}
	parts, err := partition.NewManager(pool, h.env.Settings.Partitions, nil)
	if err != nil {
		return sweep.Result{}, err
	}
	s, err := sweep.New(pool, cfg, parts, h.env.Metrics)
	if err != nil {
		// Name the payload key the value came from, or the variable.
		var ce *sweep.ConfigError
		if errors.As(err, &ce) {
			switch {
			case ce.Field == "Pause" && opts.Pause != nil:
				return sweep.Result{}, fmt.Errorf("invalid options: pause: %w", err)
			case ce.Field == "PauseRatio" && len(opts.PauseRatio) > 0:
				return sweep.Result{}, fmt.Errorf("invalid options: pause_ratio: %w", err)
			case ce.Field == "MaxDuration" && opts.MaxDuration != nil:
				return sweep.Result{}, fmt.Errorf("invalid options: max_duration: %w", err)
			}
		}
		return sweep.Result{}, err
	}
	res, err := s.Run(ctx)
	if res.Unarchivable > 0 {
		log.WarnContext(ctx, "expired live rows that expire before year 1 (a BC date) or whose key is over 2,000 bytes can never be archived: "+
			"no partition or primary key can hold them. They stay live and are answered 409 expired; correct or delete them",
			"unarchivable", res.Unarchivable)
	}
	if noBatch := (*sweep.DeadlineError)(nil); errors.As(err, &noBatch) && (noBatch.AfterTimeouts > 0 || noBatch.AfterIndexSwaps > 0) {
		// The batches were slow, or waited for a compaction's index swap
		// (after a conflict's retry too), not the invocation short: no
		// advice on the margin, which the error's own text replaces.
		log.ErrorContext(ctx, "sweep failed", append([]any{"error", err}, resultAttrs(res)...)...)
		return res, err
	} else if noBatch != nil {
		fix := fmt.Sprintf("raise the function's timeout well above SWEEP_DEADLINE_MARGIN (%s), for example to 5 minutes, "+
			"or lower SWEEP_DEADLINE_MARGIN (default SWEEP_STATEMENT_TIMEOUT + 5s) below the timeout", noBatch.Margin)
		what := "sweep started no batch: the invocation's remaining time is under SWEEP_DEADLINE_MARGIN while expired rows wait; "
		if noBatch.AfterConflict {
			what = "sweep moved nothing: its batch met an archive row that existed already, and the invocation's remaining time fell under SWEEP_DEADLINE_MARGIN before it could run again; "
		}
		log.ErrorContext(ctx, what+fix, append([]any{"remaining_ms", noBatch.Remaining.Milliseconds(),
			"sweep_deadline_margin_ms", noBatch.Margin.Milliseconds()}, resultAttrs(res)...)...)
		return res, fmt.Errorf("%w: %s", err, fix)
	}
	if err != nil {
		log.ErrorContext(ctx, "sweep failed", append([]any{"error", err}, resultAttrs(res)...)...)
		return res, err
	}
	log.InfoContext(ctx, "sweep finished", resultAttrs(res)...)
	return res, nil
}

// resultAttrs is every field of a run's result, for its log line: a failed
// invocation returns no answer, so its line is where an operator reads what
// the run did (the months it created, why it stopped).
func resultAttrs(res sweep.Result) []any {
	return []any{"moved", res.Moved, "archived", res.Archived, "batches", res.Batches,
		"conflict_retries", res.ConflictRetries, "index_swap_retries", res.IndexSwapRetries, "batch_timeouts", res.BatchTimeouts, "batch_size", res.BatchSize,
		"stopped", res.Stopped, "drained", res.Drained, "backlog", res.Backlog, "unarchivable", res.Unarchivable, "partitions_created", res.PartitionsCreated,
		"batch_max_ms", res.BatchMaxMS, "duration_ms", res.DurationMS}
}

// durationOption reads a duration option, def when it is not given. An
// empty one is refused: it is not the configured value's spelling.
func durationOption(name string, given *string, def time.Duration) (time.Duration, error) {
	if given == nil {
		return def, nil
	}
	v := *given
	if v == "" {
		return 0, fmt.Errorf("invalid options: %s is empty: leave it out for the configured value, or give a duration such as \"100ms\"", name)
	}
	// Read as the variables and flags are: "0.5ns", which time.ParseDuration
	// reads as 0, would turn max_duration into no limit.
	d, err := settings.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("invalid options: %s: %w: %q", name, err, v)
	}
	return d, nil
}
