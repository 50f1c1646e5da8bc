// Command archivebench measures the archive on a real PostgreSQL: the sweep
// against the runbook's SQL and an unbatched statement, the live store's
// register-and-complete latency with the sweeper running against the same
// traffic without it, archive lookups against the naive key-only query, the
// archive's bytes per row against the runbook's model, the archive lookups
// the fresh-key path costs, and each Lambda function's package size and cold
// start against a minimal Go function. Every figure is compared with a
// baseline measured in the same run, on the same data: the machine is shared
// and noisy, so only ratios taken side by side mean anything, and no timing
// is ever a pass/fail test.
//
//	DATABASE_URL=... archivebench -json bin/bench.json -md BENCHMARKS.md
//
// `make bench` builds what it needs, starts a throwaway PostgreSQL and runs
// it. Each measurement works in a schema of its own, dropped at the end.
// Progress goes to stderr, the tables to stdout. Sizes scale with
// BENCH_LIVE_ROWS (expired live rows each sweep contender moves, default
// 1,000,000), BENCH_UNEXPIRED_ROWS (live rows not yet expired beside them,
// the day of traffic a live table holds, default 500,000),
// BENCH_ROWS_PER_MONTH (archive rows in each monthly partition for the
// lookups, default 10,000), BENCH_MONTHS (months of data the lookups run
// against, default 24,120), BENCH_LOOKUPS (lookups per case, default 2,000),
// BENCH_FRESH_REQUESTS (requests per key shape, default 1,000),
// BENCH_COLD_STARTS (emulator starts per function, default 5),
// BENCH_TRAFFIC_OPS (register-and-complete operations of each closed-loop
// case, with the sweeper running and without it, default 24,000; each
// open-loop case runs half as many), BENCH_TRAFFIC_BACKLOG (expired live
// rows the sweeper works through beside that traffic, default 300,000) and
// BENCH_COMPACT_ROWS (archive rows of each key shape the compaction
// measurement sweeps and compacts, default 500,000). The defaults finish in
// about 5 minutes on 2 cores.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "archivebench: %s\n", oneLine(err))
		os.Exit(1)
	}
}

// sizes are the bench's scale, from the environment.
type sizes struct {
	LiveRows       int   `json:"live_rows"`
	UnexpiredRows  int   `json:"unexpired_rows"`
	RowsPerMonth   int   `json:"rows_per_month"`
	Months         []int `json:"months"`
	Lookups        int   `json:"lookups_per_case"`
	FreshRequests  int   `json:"fresh_requests"`
	ColdStarts     int   `json:"cold_starts"`
	SweepBatchSize int   `json:"sweep_batch_size"`
	TrafficOps     int   `json:"traffic_ops"`
	TrafficBacklog int   `json:"traffic_backlog_rows"`
	CompactRows    int   `json:"compact_rows"`
}

// maxSize bounds every BENCH_* size: far beyond what a run can finish, and
// far below where an allocation for it, or a sum of two, could fail.
const maxSize = 100_000_000

func sizesFromEnv(getenv func(string) string) (sizes, error) {
	s := sizes{SweepBatchSize: sweepBatch}
	for _, v := range []struct {
		name string
		dst  *int
		def  int
	}{
		{"BENCH_LIVE_ROWS", &s.LiveRows, 1_000_000},
		{"BENCH_UNEXPIRED_ROWS", &s.UnexpiredRows, 500_000},
		{"BENCH_ROWS_PER_MONTH", &s.RowsPerMonth, 10_000},
		{"BENCH_LOOKUPS", &s.Lookups, 2_000},
		{"BENCH_FRESH_REQUESTS", &s.FreshRequests, 1_000},
		{"BENCH_COLD_STARTS", &s.ColdStarts, 5},
		{"BENCH_TRAFFIC_OPS", &s.TrafficOps, 24_000},
		{"BENCH_TRAFFIC_BACKLOG", &s.TrafficBacklog, 300_000},
		{"BENCH_COMPACT_ROWS", &s.CompactRows, 500_000},
	} {
		*v.dst = v.def
		if raw := getenv(v.name); raw != "" {
			n, err := strconv.Atoi(strings.ReplaceAll(raw, "_", ""))
			if err != nil || n < 1 || n > maxSize {
				return s, fmt.Errorf("%s=%q: want a whole number from 1 to %d", v.name, raw, maxSize)
			}
			*v.dst = n
		}
	}
	s.Months = []int{24, 120}
	if raw := getenv("BENCH_MONTHS"); raw != "" {
		months, err := parseSizes(raw)
		if err != nil {
			return s, fmt.Errorf("BENCH_MONTHS=%q: %w", raw, err)
		}
		for i := 1; i < len(months); i++ {
			if months[i] <= months[i-1] {
				return s, fmt.Errorf("BENCH_MONTHS=%q: list the month counts in increasing order", raw)
			}
		}
		if months[len(months)-1] > 1200 {
			return s, fmt.Errorf("BENCH_MONTHS=%q: at most 1200 months", raw)
		}
		s.Months = months
	}
	return s, nil
}

var sections = []string{"sweep", "traffic", "lookup", "fresh", "functions", "compact"}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("archivebench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	jsonPath := fs.String("json", "bench.json", "write every figure, the machine and the versions as JSON to this file")
	mdPath := fs.String("md", "", "also write the report (BENCHMARKS.md) to this file")
	only := fs.String("only", strings.Join(sections, ","), "measure only these, comma-separated: "+strings.Join(sections, ","))
	bin := fs.String("bin", "bin", "directory of the builds (make build, make build-local-<fn>)")
	events := fs.String("events", "events", "directory of the sample events")
	rie := fs.String("rie", "bin/tools/aws-lambda-rie", "the Lambda Runtime Interface Emulator")
	command := fs.String("command", "", "the command to name in the report (default: this one)")
	render := fs.String("render", "", "measure nothing: print the tables of this JSON file of an earlier run (and write -md)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if *render != "" {
		return renderJSON(*render, *mdPath, stdout)
	}
	want := map[string]bool{}
	for _, s := range strings.Split(*only, ",") {
		s = strings.TrimSpace(s)
		if !contains(sections, s) {
			return fmt.Errorf("-only: unknown measurement %q (want %s)", s, strings.Join(sections, ", "))
		}
		want[s] = true
	}
	sz, err := sizesFromEnv(os.Getenv)
	if err != nil {
		return err
	}
	base := os.Getenv("DATABASE_URL")
	if base == "" {
		return errors.New("DATABASE_URL is not set: run `make bench`, which starts a throwaway PostgreSQL, or point DATABASE_URL at a server you may create schemas on")
	}
	if want["functions"] {
		// Fail before minutes of measuring, not after.
		if err := checkFunctionBuilds(projectFunctions(*bin, *events), *rie); err != nil {
			return err
		}
	}
	p := newProgress(os.Stderr)
	defer p.Done()
	start := time.Now()
	rep := report{Sizes: sz, Command: *command}
	if rep.Command == "" {
		rep.Command = "archivebench " + strings.Join(args, " ")
	}
	if err := rep.describe(ctx, base); err != nil {
		return err
	}
	if want["sweep"] {
		sec, err := benchSweep(ctx, base, sz.LiveRows, sz.UnexpiredRows, p)
		if err != nil {
			return fmt.Errorf("sweep: %w", err)
		}
		rep.Sweep = &sec
	}
	if want["traffic"] {
		sec, err := benchTraffic(ctx, base, sz.TrafficOps, sz.TrafficBacklog, p)
		if err != nil {
			return fmt.Errorf("traffic: %w", err)
		}
		rep.Traffic = &sec
	}
	if want["lookup"] {
		sec, err := benchLookup(ctx, base, sz.Months, sz.RowsPerMonth, sz.Lookups, p)
		if err != nil {
			return fmt.Errorf("lookup: %w", err)
		}
		rep.Lookup = &sec
	}
	if want["fresh"] {
		sec, err := benchFresh(ctx, base, sz.FreshRequests, p)
		if err != nil {
			return fmt.Errorf("fresh-key path: %w", err)
		}
		rep.Fresh = &sec
	}
	if want["functions"] {
		sec, err := benchFunctions(ctx, base, *bin, *events, *rie, sz.ColdStarts, p)
		if err != nil {
			return fmt.Errorf("functions: %w", err)
		}
		rep.Functions = &sec
	}
	if want["compact"] {
		sec, err := benchCompact(ctx, base, sz.CompactRows, p)
		if err != nil {
			return fmt.Errorf("compaction: %w", err)
		}
		rep.Compact = &sec
	}
	rep.Seconds = time.Since(start).Seconds()
	p.Step("done in %.0fs", rep.Seconds)
	p.Done()

	if err := rep.writeJSON(*jsonPath); err != nil {
		return err
	}
	tables := rep.tables()
	if _, err := io.WriteString(stdout, tables); err != nil {
		return err
	}
	if *mdPath != "" {
		if err := os.WriteFile(*mdPath, []byte(rep.document(tables)), 0o644); err != nil {
			return fmt.Errorf("write %s: %w", *mdPath, err)
		}
	}
	return nil
}

// renderJSON writes the tables and the document of an earlier run again.
func renderJSON(path, mdPath string, stdout io.Writer) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("-render: %w", err)
	}
	var rep report
	if err := json.Unmarshal(b, &rep); err != nil {
		return fmt.Errorf("-render %s: %w", path, err)
	}
	tables := rep.tables()
	if _, err := io.WriteString(stdout, tables); err != nil {
		return err
	}
	if mdPath != "" {
		if err := os.WriteFile(mdPath, []byte(rep.document(tables)), 0o644); err != nil {
			return fmt.Errorf("write %s: %w", mdPath, err)
		}
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, l := range list {
		if l == s {
			return true
		}
	}
	return false
}

// oneLine keeps the first line of an error (an emulator's output can follow).
func oneLine(err error) string {
	s := err.Error()
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i] + " (…)"
	}
	return s
}
