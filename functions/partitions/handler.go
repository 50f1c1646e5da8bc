package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/idemarchive/idemarchive/shared/fnenv"
	"github.com/idemarchive/idemarchive/shared/partition"
)

type handler struct {
	env *fnenv.Env
}

// newHandler is the function's handler as Lambda calls it: given the
// payload whole (fnenv.Raw), so that a payload holding more than one JSON
// value is refused, never read as its first.
func newHandler(env *fnenv.Env) interface {
	Invoke(context.Context, []byte) ([]byte, error)
} {
	return fnenv.Raw(env.Logger, (&handler{env: env}).Handle)
}

// options may override the configured manager for one invocation.
type options struct {
	DryRun          bool `json:"dry_run,omitempty"`
	LeadMonths      *int `json:"lead_months,omitempty"`
	RetentionMonths *int `json:"retention_months,omitempty"`
	// CompactPerRun overrides PARTITION_COMPACT_PER_RUN; 0 compacts nothing.
	CompactPerRun *int `json:"compact_per_run,omitempty"`
}

// Handle ensures future partitions, retires old ones and compacts closed ones,
// returning the DDL it ran (or, with dry_run, would run). Only this function
// compacts (PARTITION_COMPACT_PER_RUN): the migrate function runs the manager
// without, so that a deploy never waits for a rebuild.
func (h *handler) Handle(ctx context.Context, payload json.RawMessage) (partition.Result, error) {
	log := h.env.RequestLogger(ctx)
	cfg := h.env.Settings.Partitions
	cfg.CompactPerRun = h.env.Settings.PartitionCompactPerRun
	var opts options
	if err := fnenv.DecodeInput(payload, &opts); err != nil {
		return partition.Result{}, err
	}
	if opts.LeadMonths != nil {
		// Zero means "default" in the Config; as an override it is a mistake.
		if *opts.LeadMonths < 2 {
			return partition.Result{}, fmt.Errorf("invalid options: lead_months must be at least 2, got %d", *opts.LeadMonths)
		}
		cfg.LeadMonths = *opts.LeadMonths
	}
	if opts.RetentionMonths != nil {
		cfg.RetentionMonths = *opts.RetentionMonths
	}
	if opts.CompactPerRun != nil {
		cfg.CompactPerRun = *opts.CompactPerRun
	}
	// Validate before connecting: a bad override is the caller's mistake and
	// must never reach the manager.
	if err := cfg.WithDefaults().Validate(); err != nil {
		// Named by the option that set the field, when one did.
		given := map[string]struct {
			option string
			set    bool
		}{
			"LeadMonths":      {"lead_months", opts.LeadMonths != nil},
			"RetentionMonths": {"retention_months", opts.RetentionMonths != nil},
			"CompactPerRun":   {"compact_per_run", opts.CompactPerRun != nil},
		}
		var ce *partition.ConfigError
		if errors.As(err, &ce) && given[ce.Field].set {
			return partition.Result{}, fmt.Errorf("invalid options: %s: %w", given[ce.Field].option, err)
		}
		return partition.Result{}, fmt.Errorf("invalid options: %w", err)
	}
	pool, err := h.env.DB.Get(ctx)
	if err != nil {
		return partition.Result{}, err
	}
	m, err := partition.NewManager(pool, cfg, h.env.Metrics)
	if err != nil {
		return partition.Result{}, err
	}
	// The run stops before the invocation's deadline, with time to answer
	// and log what it did: cut by the platform, it would answer "Task
	// timed out" alone, and its log line might never be written.
	runCtx := ctx
	if deadline, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		runCtx, cancel = context.WithDeadline(ctx, deadline.Add(-min(answerMargin, time.Until(deadline)/4)))
		defer cancel()
	}
	res, err := m.Run(runCtx, opts.DryRun)
	for _, f := range res.Foreign {
		log.WarnContext(ctx, "partition not managed", "partition", f.Name, "bound", f.Bound, "problem", f.Problem)
	}
	if err != nil {
		log.ErrorContext(ctx, "partition run failed", append([]any{"error", err}, resultAttrs(res)...)...)
		return res, err
	}
	log.InfoContext(ctx, "partition run finished", resultAttrs(res)...)
	return res, nil
}

// answerMargin is kept before the invocation's deadline for the run's
// answer and log line (a quarter of the time left, when that is less).
const answerMargin = 5 * time.Second

// resultAttrs is every action of a run's result, for its log line: a
// scheduled run's answer goes nowhere, and a failed invocation's is its
// error alone, so the line is the record of what the run did.
func resultAttrs(res partition.Result) []any {
	return []any{"dry_run", res.DryRun, "created", res.Created, "reattached", res.Reattached, "retired", res.Retired,
		"finalized", res.Finalized, "adopted", res.Adopted, "compacted", res.Compacted, "compact_pending", res.CompactPending,
		"dropped_indexes", res.DroppedIndexes, "plain_keys", res.PlainKeys, "failed", res.Failed, "refused", res.Refused,
		"newest_partition_days", res.NewestPartitionDays}
}
