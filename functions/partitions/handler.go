package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

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
	return fnenv.Raw((&handler{env: env}).Handle)
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
	res, err := m.Run(ctx, opts.DryRun)
	for _, f := range res.Foreign {
		log.WarnContext(ctx, "partition not managed", "partition", f.Name, "bound", f.Bound, "problem", f.Problem)
	}
	if err != nil {
		log.ErrorContext(ctx, "partition run failed", "error", err, "created", res.Created, "reattached", res.Reattached,
			"retired", res.Retired, "compacted", res.Compacted, "failed", res.Failed, "refused", res.Refused)
		return res, err
	}
	log.InfoContext(ctx, "partition run finished", "dry_run", res.DryRun, "created", res.Created, "reattached", res.Reattached,
		"retired", res.Retired, "finalized", res.Finalized, "compacted", res.Compacted, "compact_pending", len(res.CompactPending),
		"dropped_indexes", res.DroppedIndexes, "newest_partition_days", res.NewestPartitionDays)
	return res, nil
}
