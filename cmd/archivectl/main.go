// Command archivectl operates the idempotency key archive: it migrates the
// schema, manages partitions, sweeps expired keys, looks keys up, runs
// investigation queries and verifies the runbook's checks.
//
// It reads DATABASE_URL and the same configuration variables as the Lambda
// functions (see the README). Results go to stdout as JSON; errors are one line
// on stderr. Exit status: 0 success, 1 "no" (key not found, a check failed),
// 2 error.
package main

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/database"
	"github.com/idemarchive/idemarchive/shared/livestore"
	"github.com/idemarchive/idemarchive/shared/metrics"
	"github.com/idemarchive/idemarchive/shared/partition"
	"github.com/idemarchive/idemarchive/shared/schema"
	"github.com/idemarchive/idemarchive/shared/settings"
	"github.com/idemarchive/idemarchive/shared/sweep"
	"github.com/idemarchive/idemarchive/shared/verify"
)

const usage = `usage: archivectl <command> [flags]

commands:
  migrate                     apply schema migrations and role grants
  partitions [--lead-months N] [--retention-months N] [--compact-per-run N] [--dry-run]
                              ensure future partitions, retire old ones,
                              compact closed months when asked
  sweep [--batch N] [--pause D] [--pause-ratio R] [--max-duration D]
                              move expired live keys into the archive
  lookup KEY [--fingerprint HEX]
                              look up one scoped key (exit 1 when not found)
  query --scope-prefix P --created-from T --created-to T [--limit N] [--cursor C]
                              list archived keys for an investigation
  verify [--recent D]         the runbook's four checks, the recording check and the tables' integrity (exit 1 when one fails)
  redis-reconcile [--redis-url URL] [--prefix P] [--dry-run]
                              archive the Redis store's completed keys kept
                              without expiry and give them back their expiry
                              (exit 1 when one is left)

Every command takes --emit-metrics to write CloudWatch EMF lines to stderr.
Configuration comes from DATABASE_URL and the variables listed in the README.
`

// Exit statuses.
const (
	exitOK    = 0
	exitNo    = 1
	exitError = 2
)

// errNo ends a command with exit status 1 after it printed its answer.
var errNo = errors.New("no")

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// The first signal cancels the run, which then winds down (a sweep
	// counts the backlog left, a summary is printed); the signals' default
	// action is then restored, so that a second Ctrl-C ends the process at
	// once instead of being caught and ignored.
	go func() {
		<-ctx.Done()
		stop()
	}()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv))
}

// env is what a command needs from its surroundings.
type env struct {
	stdout, stderr io.Writer
	settings       settings.Settings
	metrics        *metrics.Emitter
	logger         *slog.Logger
	stderrIsTTY    bool
	getenv         func(string) string
	// helpOnly: the arguments may ask for help; commands parse their flags
	// and stop before touching configuration or the database.
	helpOnly bool
	// emitMetrics is --emit-metrics as run read it before the command's
	// flags were parsed; emitMetricsParsed is what the parse read.
	emitMetrics, emitMetricsParsed bool
}

// errNotHelp ends a helpOnly run whose "-h" turned out to be data (a value,
// or an argument after "--"): the command then runs for real.
var errNotHelp = errors.New("not a help request")

type command func(ctx context.Context, e *env, pool *pgxpool.Pool, args []string) error

// helpArg reports whether the argument before any command asks for help:
// "help", or -h or -help in any spelling the flag package reads as such
// (--h, --help=true), as after a command.
func helpArg(arg string) bool {
	if arg == "help" {
		return true
	}
	fs := flag.NewFlagSet("archivectl", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return errors.Is(fs.Parse([]string{arg}), flag.ErrHelp)
}

var commands = map[string]command{
	"migrate":    cmdMigrate,
	"partitions": cmdPartitions,
	"sweep":      cmdSweep,
	"lookup":     cmdLookup,
	"query":      cmdQuery,
	"verify":     cmdVerify,

	"redis-reconcile": cmdRedisReconcile,
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	if len(args) == 0 || helpArg(args[0]) {
		fmt.Fprint(stderr, usage)
		if len(args) == 0 {
			return exitError
		}
		return exitOK
	}
	cmd, ok := commands[args[0]]
	if !ok {
		// Redacted: a connection string typed before the command.
		fmt.Fprintf(stderr, "archivectl: unknown command %s (run archivectl --help)\n", settings.Redact(strconv.Quote(args[0])))
		return exitError
	}
	// Every error line is redacted: an argument or a flag's value echoed
	// back (--fingerprint, --created-from, ...) may be a connection string
	// pasted in the wrong place.
	fail := func(err error) int {
		fmt.Fprintf(stderr, "archivectl %s: %s\n", args[0], settings.Redact(oneLine(err)))
		return exitError
	}

	// --emit-metrics is every command's flag, read before the command's
	// own flags are parsed (the metrics are set up first), only before
	// "--" (after it, everything is an argument); the command's parse
	// reads it again and refuses a disagreement (see parse).
	rest := args[1:]
	emitMetrics, err := scanFlag(rest, "emit-metrics")
	if err != nil {
		return fail(err)
	}
	// A first pass parses the flags alone: help and flag errors need
	// neither configuration nor a database. Only the flag parser can tell
	// "-h" the flag from "-h" the key or value.
	{
		e := &env{stdout: stdout, stderr: stderr, helpOnly: true, emitMetrics: emitMetrics}
		switch err := cmd(ctx, e, nil, rest); {
		case errors.Is(err, flag.ErrHelp):
			return exitOK
		case !errors.Is(err, errNotHelp):
			return fail(err)
		}
	}
	s, err := settings.FromEnv(getenv)
	if err != nil {
		return fail(err)
	}
	e := &env{
		stdout:      stdout,
		stderr:      stderr,
		settings:    s,
		getenv:      getenv,
		emitMetrics: emitMetrics,
		// JSON, like every other log line the project writes.
		logger: slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo})),
	}
	if f, ok := stderr.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			e.stderrIsTTY = true
		}
	}
	if emitMetrics {
		e.metrics = metrics.New(stderr, s.MetricsNamespace)
	}

	var awsCfg *aws.Config
	if s.Database.SecretARN != "" || s.Database.IAMAuth {
		c, err := awsconfig.LoadDefaultConfig(ctx)
		if err != nil {
			return fail(fmt.Errorf("load AWS configuration: %w", err))
		}
		awsCfg = &c
	}
	pool, err := database.Open(ctx, s.Database, awsCfg)
	if err != nil {
		return fail(err)
	}
	defer pool.Close()

	switch err := cmd(ctx, e, pool, rest); {
	case err == nil:
		return exitOK
	case errors.Is(err, errNo):
		return exitNo
	case errors.Is(err, flag.ErrHelp):
		return exitOK
	default:
		return fail(unmigrated(ctx, pool, args[0], err))
	}
}

// unmigrated adds to the error of a command other than migrate that met a
// table, column or function missing from the schema it reads what to do
// about it: migrate, where the schema's recorded version is older than this
// release's (a new database, an install not migrated yet); else look, as it
// was changed by hand or the search_path finds another schema first.
func unmigrated(ctx context.Context, pool *pgxpool.Pool, command string, err error) error {
	switch database.SQLState(err) {
	case database.CodeUndefinedTable, database.CodeUndefinedColumn, database.CodeUndefinedFunction:
	default:
		return err
	}
	if command == "migrate" {
		return err
	}
	// The command's own context may be what ended it.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	latest := schema.LatestVersion()
	v, verr := schema.Version(ctx, pool)
	switch {
	case verr != nil:
		return fmt.Errorf("%w: is the schema first on DATABASE_URL's search_path at this release's version %d? run `archivectl migrate`, or check the search_path", err, latest)
	case v > latest:
		return fmt.Errorf("%w: the schema first on DATABASE_URL's search_path is at version %d, newer than this release's %d: use the archivectl of the release that migrated it", err, v, latest)
	case v < latest:
		return fmt.Errorf("%w: the schema first on DATABASE_URL's search_path is at version %d, not this release's %d: run `archivectl migrate` first, or check the search_path", err, v, latest)
	default:
		return fmt.Errorf("%w: the schema first on DATABASE_URL's search_path is at version %d, yet lacks what the error names: it was changed by hand (`archivectl verify` says what), or the user may not use it", err, v)
	}
}

func cmdMigrate(ctx context.Context, e *env, pool *pgxpool.Pool, args []string) error {
	fs := newFlagSet("migrate", e)
	if _, err := parse(e, fs, args, 0); err != nil {
		return err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Release()
	res, err := schema.Migrate(ctx, conn.Conn(), e.logger)
	if err != nil {
		return err
	}
	return e.printJSON(res)
}

func cmdPartitions(ctx context.Context, e *env, pool *pgxpool.Pool, args []string) error {
	cfg := e.settings.Partitions
	fs := newFlagSet("partitions", e)
	fs.Var((*intValue)(&cfg.LeadMonths), "lead-months", "`months` ahead that must have partitions (default 3, at least 2)")
	fs.Var((*intValue)(&cfg.RetentionMonths), "retention-months", "whole `months` kept before the current one (0 keeps everything)")
	cfg.CompactPerRun = 0
	fs.Var((*intValue)(&cfg.CompactPerRun), "compact-per-run", "closed `months` whose primary key to rebuild (compact), each for up to PARTITION_STATEMENT_TIMEOUT; 0, the default here, compacts none")
	dryRun := fs.Bool("dry-run", false, "print the DDL that would run, run nothing")
	if _, err := parse(e, fs, args, 0); err != nil {
		return err
	}
	// Zero means "default" in the Config; on the command line it is a mistake.
	if err := atLeast(fs, "lead-months", cfg.LeadMonths, 2); err != nil {
		return err
	}
	m, err := partition.NewManager(pool, cfg, e.metrics)
	if err != nil {
		var ce *partition.ConfigError
		if errors.As(err, &ce) && ce.Field == "RetentionMonths" {
			return fmt.Errorf("--retention-months: %w", err)
		}
		if errors.As(err, &ce) && ce.Field == "CompactPerRun" {
			return fmt.Errorf("--compact-per-run: %w", err)
		}
		if errors.As(err, &ce) && ce.Field == "LeadMonths" {
			return fmt.Errorf("--lead-months: %w", err)
		}
		return err
	}
	// The summary is printed even when a step failed: the other steps ran,
	// and it says which failed and why.
	res, runErr := m.Run(ctx, *dryRun)
	if *dryRun {
		var plan strings.Builder
		if len(res.Statements) == 0 && runErr == nil {
			fmt.Fprintln(&plan, "-- nothing to do")
		}
		for _, f := range res.Foreign {
			// A comment line: a name made by hand must not end it and
			// write a statement of its own into a plan run with psql -f.
			fmt.Fprintf(&plan, "-- not managed: %s %s: %s\n", oneLineText(f.Name), oneLineText(f.Bound), oneLineText(f.Problem))
		}
		for _, stmt := range res.Statements {
			fmt.Fprintln(&plan, stmt+";")
		}
		// A plan that could not be written (a full disk under `>
		// plan.sql`) is a failure, not an empty plan.
		return errors.Join(runErr, e.print(plan.String()))
	}
	if runErr != nil && len(res.Statements) == 0 && len(res.Failed) == 0 && len(res.Refused) == 0 {
		return runErr // nothing ran: the error says it all
	}
	// A summary that could not be written does not hide why the run failed.
	return errors.Join(runErr, e.printJSON(res))
}

func cmdSweep(ctx context.Context, e *env, pool *pgxpool.Pool, args []string) error {
	cfg := e.settings.Sweep
	fs := newFlagSet("sweep", e)
	fs.Var((*intValue)(&cfg.BatchSize), "batch", "`rows` per batch (default 10000, at most 50000)")
	fs.Var((*durationValue)(&cfg.Pause), "pause", "fixed `duration` to pause between batches (default 200ms; 0: none)")
	fs.Var((*ratioValue)(&cfg.PauseRatio), "pause-ratio", "add this `multiple` of the time worked since the last pause to the pause after it, 0 to 99 (default 3; 0: none)")
	fs.Var((*durationValue)(&cfg.MaxDuration), "max-duration", "start no batch after this `duration` (default: until drained)")
	if _, err := parse(e, fs, args, 0); err != nil {
		return err
	}
	if err := atLeast(fs, "batch", cfg.BatchSize, sweep.MinBatchSize); err != nil {
		return err
	}
	parts, err := partition.NewManager(pool, e.settings.Partitions, nil)
	if err != nil {
		return err
	}
	var s *sweep.Sweeper
	emitter := e.metrics
	var p *progress
	if e.stderrIsTTY {
		p = &progress{w: e.stderr, backlog: func() (int64, error) { return s.Backlog(ctx) }}
		cfg.OnBatch = p.report
		if emitter != nil {
			// An EMF line must start a line of its own, never follow the
			// carriage-returned progress line.
			emitter = metrics.New(p.lineWriter(), e.settings.MetricsNamespace)
		}
	}
	if s, err = sweep.New(pool, cfg, parts, emitter); err != nil {
		var ce *sweep.ConfigError
		if errors.As(err, &ce) {
			switch ce.Field {
			case "BatchSize":
				return fmt.Errorf("--batch: %w", err)
			case "MaxDuration":
				return fmt.Errorf("--max-duration: %w", err)
			case "Pause":
				return fmt.Errorf("--pause: %w", err)
			case "PauseRatio":
				return fmt.Errorf("--pause-ratio: %w", err)
			}
		}
		return err
	}
	res, err := s.Run(ctx)
	if p != nil {
		p.done(res)
	}
	if err != nil {
		// Say how far the run got before the error line.
		_ = e.printJSON(res)
		return err
	}
	return e.printJSON(res)
}

// progress prints a one-line, self-overwriting progress report on a terminal.
type progress struct {
	w           io.Writer
	backlog     func() (int64, error)
	lastBacklog time.Time
	left        string
	open        bool // a progress line is on screen without its newline
}

func (p *progress) report(pr sweep.Progress) {
	// Counting the backlog costs a query: refresh it every two seconds.
	if time.Since(p.lastBacklog) > 2*time.Second {
		p.lastBacklog = time.Now()
		if n, err := p.backlog(); err == nil {
			p.left = fmt.Sprintf("%d", n)
		}
	}
	p.line(pr.Moved, pr.Batches, pr.Elapsed, cmp.Or(p.left, "?"))
}

func (p *progress) line(moved int64, batches int, elapsed time.Duration, left string) {
	rate := float64(moved) / max(elapsed.Seconds(), 0.001)
	fmt.Fprintf(p.w, "\rsweep: %d rows moved in %d batches, %.0f rows/s, backlog left %s   ", moved, batches, rate, left)
	p.open = true
}

// done rewrites the progress line with the run's final figures (the backlog
// counted after the last batch, not the last sample) and ends it.
func (p *progress) done(res sweep.Result) {
	if !p.open && res.Batches == 0 {
		return
	}
	left := "?"
	if res.Backlog >= 0 {
		left = fmt.Sprintf("%d", res.Backlog)
	}
	p.line(res.Moved, res.Batches, time.Duration(res.DurationMS)*time.Millisecond, left)
	p.end()
}

func (p *progress) end() {
	if p.open {
		fmt.Fprintln(p.w)
		p.open = false
	}
}

// lineWriter writes to the terminal after ending any open progress line.
func (p *progress) lineWriter() io.Writer {
	return writerFunc(func(b []byte) (int, error) {
		p.end()
		return p.w.Write(b)
	})
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

func cmdLookup(ctx context.Context, e *env, pool *pgxpool.Pool, args []string) error {
	fs := newFlagSet("lookup", e)
	fpHex := fs.String("fingerprint", "", "hex SHA-256 fingerprint (64 hex digits) to compare with the archived one")
	pos, err := parse(e, fs, args, 1)
	if err != nil {
		return err
	}
	var fp []byte
	if given(fs, "fingerprint") {
		switch fp, err = hex.DecodeString(*fpHex); {
		case *fpHex == "":
			// An unset shell variable ("--fingerprint $FP"), most likely:
			// a lookup without comparison leaves the flag out.
			return errors.New("--fingerprint is empty: give a hex SHA-256, or leave the flag out")
		case err != nil:
			return fmt.Errorf("--fingerprint is not hex: %q", *fpHex)
		case len(fp) > maxFingerprintBytes:
			return fmt.Errorf("--fingerprint is %d bytes, more than %d (a SHA-256 is 64 hex digits)", len(fp), maxFingerprintBytes)
		}
	}
	r, err := archive.NewReader(pool, e.settings.Archive, e.metrics)
	if err != nil {
		return err
	}
	rec, err := r.Lookup(ctx, pos[0], fp)
	if errors.Is(err, archive.ErrNotFound) {
		fmt.Fprintf(e.stderr, "archivectl lookup: not in the archive: %s\n", settings.Redact(fmt.Sprintf("%q", pos[0])))
		return errNo
	}
	if err != nil {
		return err
	}
	if err := e.printJSON(rec); err != nil {
		return err
	}
	// Fingerprints are compared only as SHA-256 digests, unless equal
	// (archive.Record.FingerprintMatch): say why the answer has no
	// fingerprint_match, or a truncated paste reads as no answer at all.
	if fp != nil && rec.FingerprintMatch == nil {
		if len(fp) != sha256.Size {
			fmt.Fprintf(e.stderr, "archivectl lookup: no fingerprint_match: --fingerprint is %d hex digits, not a SHA-256 digest (64), and differs from the archived one\n", 2*len(fp))
		} else {
			fmt.Fprintln(e.stderr, "archivectl lookup: no fingerprint_match: the archived fingerprint is not a SHA-256 digest, and differs from --fingerprint")
		}
	}
	return nil
}

// maxFingerprintBytes is the longest --fingerprint taken, as the lookup API
// takes (lookupapi): a SHA-256 is 32 bytes, but the archive may hold other
// fingerprints (the runbook's probe stores '\x00'), compared when equal.
const maxFingerprintBytes = 64

// given says whether the flag name was set on the command line.
func given(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// cmdRedisReconcile archives the outcomes a Redis live store kept without
// expiry because their archive rows could not be written at completion
// (livestore.Redis.Reconcile), through DATABASE_URL's user, which needs
// INSERT on the archive.
func cmdRedisReconcile(ctx context.Context, e *env, pool *pgxpool.Pool, args []string) error {
	fs := newFlagSet("redis-reconcile", e)
	url := fs.String("redis-url", "", "the Redis store's server, redis:// or rediss:// (default $REDIS_URL, which keeps a password out of ps and shell history)")
	prefix := fs.String("prefix", "", "the store's key prefix, as given to livestore.NewRedis")
	dryRun := fs.Bool("dry-run", false, "count the keys kept without expiry, and change nothing")
	if _, err := parse(e, fs, args, 0); err != nil {
		return err
	}
	source := "--redis-url"
	switch {
	case given(fs, "redis-url") && *url == "":
		// An unset shell variable (--redis-url="$STAGING_REDIS"): run
		// against REDIS_URL's server instead, the operator did not name.
		return errors.New("--redis-url is empty: give a URL, or leave the flag out to use REDIS_URL")
	case *url == "":
		source, *url = "REDIS_URL", e.getenv("REDIS_URL")
	}
	if *url == "" {
		return errors.New("--redis-url or REDIS_URL is required")
	}
	if strings.ContainsAny(*url, "#") {
		// A Redis URL has no fragment: a '#' is a password's, not
		// percent-encoded, and what follows it would be cut off (the
		// password's start then read as the port, and named in a dial
		// error).
		return fmt.Errorf("%s holds a '#': percent-encode it (%%23) in the password", source)
	}
	opts, err := redis.ParseURL(*url)
	if err != nil {
		// Not the URL itself, nor the parser's words on it: it may hold a
		// password. The error names where the URL came from.
		return fmt.Errorf("%s is not a redis:// or rediss:// URL", source)
	}
	if opts.DB < 0 {
		// go-redis selects a database only above 0: it would read
		// database 0's hashes, and reconcile them, in the one named.
		return fmt.Errorf("%s names Redis database %d: database numbers start at 0", source, opts.DB)
	}
	// go-redis logs each failed dial on stderr by itself, in its own
	// format: the error it returns says the same, and errors are one line.
	redis.SetLogger(discardRedisLog{})
	client := redis.NewClient(opts)
	defer client.Close()
	res, err := livestore.NewRedis(client, pool, *prefix).Reconcile(ctx, *dryRun, func(key string, err error) {
		fmt.Fprintf(e.stderr, "archivectl redis-reconcile: %q: %s\n", key, oneLine(err))
	})
	if err != nil {
		// What it did before it stopped (a failover, an interrupt, the
		// database gone) is done: the summary says how much, the error
		// why it stopped.
		if res.Scanned > 0 {
			_ = e.printJSON(res)
		}
		return err
	}
	if err := e.printJSON(res); err != nil {
		return err
	}
	// Nothing at all under the prefix reads like "nothing left" but is
	// also what a mistyped --prefix or the wrong database index gives. An
	// empty store is legitimate (a fresh or idle one: every key expires),
	// so this is a warning, and the exit status stays 0.
	if res.Scanned == 0 {
		fmt.Fprintf(e.stderr, "archivectl redis-reconcile: warning: no key under prefix %s in Redis database %d: is this the store's prefix and database?\n", settings.Redact(strconv.Quote(*prefix)), opts.DB)
	}
	// A dry run changed nothing: what it found is still left.
	if res.Failed > 0 || (*dryRun && res.Kept > 0) {
		return errNo
	}
	return nil
}

// discardRedisLog drops go-redis's own log lines (see cmdRedisReconcile).
type discardRedisLog struct{}

func (discardRedisLog) Printf(context.Context, string, ...any) {}

func cmdQuery(ctx context.Context, e *env, pool *pgxpool.Pool, args []string) error {
	var q archive.Query
	var from, to string
	fs := newFlagSet("query", e)
	fs.StringVar(&q.ScopePrefix, "scope-prefix", "", "scoped keys starting with this, byte for byte (required)")
	fs.StringVar(&from, "created-from", "", "RFC 3339 time, inclusive (required)")
	fs.StringVar(&to, "created-to", "", "RFC 3339 time, exclusive (required)")
	q.Limit = 100
	fs.Var((*intValue)(&q.Limit), "limit", "page size, in `records`")
	fs.StringVar(&q.Cursor, "cursor", "", "next_cursor of the previous page")
	if _, err := parse(e, fs, args, 0); err != nil {
		return err
	}
	if err := atLeast(fs, "limit", q.Limit, 1); err != nil {
		return err
	}
	var err error
	if q.CreatedFrom, err = parseTime("--created-from", from); err != nil {
		return err
	}
	if q.CreatedTo, err = parseTime("--created-to", to); err != nil {
		return err
	}
	r, err := archive.NewReader(pool, e.settings.Archive, e.metrics)
	if err != nil {
		return err
	}
	page, err := r.Investigate(ctx, q)
	if err != nil {
		return err
	}
	return e.printJSON(page)
}

func cmdVerify(ctx context.Context, e *env, pool *pgxpool.Pool, args []string) error {
	opts := verify.Options{InFlightGrace: e.settings.Sweep.InFlightGrace}
	fs := newFlagSet("verify", e)
	opts.Recent = 24 * time.Hour
	fs.Var((*durationValue)(&opts.Recent), "recent", "window (a `duration`) in which archive rows must exist")
	if _, err := parse(e, fs, args, 0); err != nil {
		return err
	}
	if opts.Recent <= 0 {
		return fmt.Errorf("--recent must be a positive duration, got %s", opts.Recent)
	}
	checks, err := verify.Run(ctx, pool, opts)
	if err != nil {
		return err
	}
	failed := false
	var table strings.Builder
	for _, c := range checks {
		verdict := "PASS"
		if !c.Pass {
			verdict, failed = "FAIL", true
		}
		// A name made by hand (a partition's, a column's) in a figure
		// must not write a line of its own, a PASS a script would read.
		fmt.Fprintf(&table, "%s  %-36s %s\n", verdict, c.Name, oneLineText(c.Figure))
	}
	if err := e.print(table.String()); err != nil {
		return err
	}
	if failed {
		return errNo
	}
	return nil
}

func newFlagSet(name string, e *env) *flag.FlagSet {
	fs := flag.NewFlagSet("archivectl "+name, flag.ContinueOnError)
	fs.BoolVar(&e.emitMetricsParsed, "emit-metrics", false, "write the run's metrics as CloudWatch EMF lines on stderr")
	// The flag package prints errors and usage itself; errors are reported
	// once, on one line, by run, and usage only on -h.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// parse parses flags that may come before or after exactly nPos positional
// arguments ("lookup KEY --fingerprint X" as well as "lookup --fingerprint X KEY").
// Everything after "--" is positional, so a key that looks like a flag
// ("lookup -- -h") is data.
//
// A flag given more than once is refused, as the Lambda functions refuse an
// option named twice: the flag package would silently keep the last value
// ("--dry-run --dry-run=false" would run for real).
func parse(e *env, fs *flag.FlagSet, args []string, nPos int) ([]string, error) {
	twice := refuseRepeats(fs)
	defer unwrapRepeats(fs)
	inline := inlineFlags(args)
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if *twice != "" {
				return nil, fmt.Errorf("--%s is given more than once: give each flag once", *twice)
			}
			if errors.Is(err, flag.ErrHelp) {
				unwrapRepeats(fs) // the help names the flags' own types
				fmt.Fprintf(e.stderr, "usage of %s:\n", fs.Name())
				fs.SetOutput(e.stderr)
				fs.PrintDefaults()
				return nil, err
			}
			return nil, errors.New(settings.Redact(strings.TrimSpace(err.Error())))
		}
		// The flag package drops a "--" that ends the flags: whatever
		// follows it is positional, however it looks.
		consumed := len(args) - len(fs.Args())
		terminated := consumed > 0 && args[consumed-1] == "--"
		args = fs.Args()
		if terminated {
			pos = append(pos, args...)
			break
		}
		if len(args) == 0 {
			break
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
	// A flag given no value takes the next argument for its own:
	// "--prefix --emit-metrics --dry-run" is read as prefix
	// "--emit-metrics", "--prefix -- --emit-metrics" as prefix "--". Run
	// as neither the line's reader nor its writer meant, it is refused.
	var took error
	fs.Visit(func(f *flag.Flag) {
		v := f.Value.String()
		if name := strings.TrimLeft(v, "-"); took == nil && !inline[f.Name] && name != v && (name == "emit-metrics" || strings.HasPrefix(name, "emit-metrics=")) {
			took = fmt.Errorf("--%s took %q for its value: give each flag its value (--name=value)", f.Name, v)
		}
	})
	if took == nil && e.emitMetricsParsed != e.emitMetrics {
		took = errors.New(`a flag took "--" or --emit-metrics for its value: give each flag its value (--name=value)`)
	}
	if took != nil {
		return nil, took
	}
	if e.helpOnly {
		return nil, errNotHelp
	}
	if len(pos) != nPos {
		return nil, fmt.Errorf("want %d argument(s), got %d: %s", nPos, len(pos), settings.Redact(fmt.Sprintf("%q", pos)))
	}
	return pos, nil
}

// inlineFlags names the flags args gives as -name=value or --name=value,
// before any "--" that ends the flags: their values are what the line's
// writer meant, whatever they look like.
func inlineFlags(args []string) map[string]bool {
	inline := map[string]bool{}
	for _, a := range args {
		if a == "--" {
			break
		}
		name, _, ok := strings.Cut(a, "=")
		if !ok || !strings.HasPrefix(name, "-") {
			continue
		}
		name = strings.TrimPrefix(name, "-")
		name = strings.TrimPrefix(name, "-")
		if name != "" && !strings.HasPrefix(name, "-") {
			inline[name] = true
		}
	}
	return inline
}

// onceValue wraps a flag's Value to refuse a second Set: the flag package
// calls Set once for each time the flag is given.
type onceValue struct {
	flag.Value
	name  string
	set   bool
	twice *string // set to name on the second Set
}

func (o *onceValue) Set(s string) error {
	if o.set {
		*o.twice = o.name
		return errors.New("given more than once")
	}
	o.set = true
	return o.Value.Set(s)
}

// onceBoolValue is onceValue for a boolean flag, which takes no value
// ("--dry-run"): the flag package asks IsBoolFlag.
type onceBoolValue struct{ *onceValue }

func (onceBoolValue) IsBoolFlag() bool { return true }

// refuseRepeats wraps every flag of fs in a onceValue, until
// unwrapRepeats, and returns where the name of a flag given twice lands.
func refuseRepeats(fs *flag.FlagSet) *string {
	twice := new(string)
	fs.VisitAll(func(f *flag.Flag) {
		o := &onceValue{Value: f.Value, name: f.Name, twice: twice}
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
			f.Value = onceBoolValue{o}
			return
		}
		f.Value = o
	})
	return twice
}

// unwrapRepeats gives fs's flags back their own Values.
func unwrapRepeats(fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		switch v := f.Value.(type) {
		case *onceValue:
			f.Value = v.Value
		case onceBoolValue:
			f.Value = v.Value
		}
	})
}

// flagPart is args up to the first "--": the part that may hold flags.
func flagPart(args []string) []string {
	if i := slices.Index(args, "--"); i >= 0 {
		return args[:i]
	}
	return args
}

// scanFlag reports whether a boolean flag (-name or --name, or either with
// =value as the flag package spells booleans: =true, =false, =1, =0, ...)
// is on in the flag part of args. Given more than once, it is refused, as
// every flag is (see parse).
func scanFlag(args []string, name string) (bool, error) {
	on, seen := false, false
	for _, a := range flagPart(args) {
		flag, value, hasValue := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-"), "=")
		if !strings.HasPrefix(a, "-") || flag != name {
			continue
		}
		if seen {
			return false, fmt.Errorf("--%s is given more than once: give each flag once", name)
		}
		seen = true
		if !hasValue {
			on = true
			continue
		}
		b, err := strconv.ParseBool(value)
		if err != nil {
			return false, fmt.Errorf("invalid boolean value %q for --%s", value, name)
		}
		on = b
	}
	return on, nil
}

// atLeast rejects a flag given explicitly with a value below min.
func atLeast(fs *flag.FlagSet, name string, value, min int) error {
	var err error
	fs.Visit(func(f *flag.Flag) {
		if f.Name == name && value < min {
			err = fmt.Errorf("--%s must be at least %d, got %d", name, min, value)
		}
	})
	return err
}

// intValue is a whole-number flag read as the configuration variables are
// (PARTITION_RETENTION_MONTHS and the others: strconv.Atoi after trimming
// spaces): base 10 with an optional sign, so "012" is 12 and "+3" is 3.
// The flag package's own reads base 0, where "012" is octal 10, "0xA" 10
// and "1_0" 10: a retention read shorter than meant drops months for good.
type intValue int

func (n *intValue) Set(s string) error {
	v, err := strconv.Atoi(strings.TrimSpace(s))
	switch {
	case errors.Is(err, strconv.ErrRange):
		return errors.New("out of range")
	case err != nil:
		return errors.New("not a whole number")
	}
	*n = intValue(v)
	return nil
}

func (n *intValue) String() string { return strconv.Itoa(int(*n)) }

// durationValue is a duration flag read as the configuration variables are
// (settings.ParseDuration): a value too long to hold is out of range, and a
// nonzero one shorter than a nanosecond is refused. Read as 0 it would mean
// the opposite of what was asked: --max-duration 0 sweeps until drained,
// --pause 0 takes no fixed pause.
type durationValue time.Duration

func (d *durationValue) Set(s string) error {
	v, err := settings.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = durationValue(v)
	return nil
}

func (d *durationValue) String() string { return time.Duration(*d).String() }

// ratioValue is a ratio flag read as the configuration variables are
// (settings.ParseRatio): a plain decimal number, never silently zero.
type ratioValue float64

func (r *ratioValue) Set(s string) error {
	v, err := settings.ParseRatio(s)
	if err != nil {
		return err
	}
	*r = ratioValue(v)
	return nil
}

func (r *ratioValue) String() string { return strconv.FormatFloat(float64(*r), 'g', -1, 64) }

func parseTime(flagName, v string) (time.Time, error) {
	if v == "" {
		return time.Time{}, fmt.Errorf("%s is required", flagName)
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, fmt.Errorf("%s is not an RFC 3339 time such as 2026-12-01T00:00:00Z: %q", flagName, v)
	}
	return t, nil
}

// oneLineText is s, quoted when it holds a control character (a newline in
// a name made by hand), so that it stays on the line it is printed on.
func oneLineText(s string) string {
	if strings.ContainsFunc(s, unicode.IsControl) {
		return strconv.Quote(s)
	}
	return s
}

// escapeControls writes every control character of s but newline, tab and
// carriage return (which oneLine folds into spaces) as its Go escape (\x1b,
// \u009b), and every byte that is no UTF-8 as \xNN: a lone 0x9b is CSI to a
// terminal that reads 8-bit controls.
func escapeControls(s string) string {
	escape := func(r rune, size int) bool {
		return r == utf8.RuneError && size == 1 || unicode.IsControl(r) && !unicode.IsSpace(r)
	}
	clean := true
	for i := 0; i < len(s) && clean; {
		r, size := utf8.DecodeRuneInString(s[i:])
		clean = !escape(r, size)
		i += size
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case escape(r, size):
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// print writes text to stdout; an error says the output is incomplete.
func (e *env) print(text string) error {
	if _, err := io.WriteString(e.stdout, text); err != nil {
		return fmt.Errorf("write the output: %w", err)
	}
	return nil
}

func (e *env) printJSON(v any) error {
	enc := json.NewEncoder(e.stdout)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("write the output: %w", err)
	}
	return nil
}

// oneLine keeps an error message on one line, so that errors never look like
// stack traces.
// A multi-line error (pgx reports each connection attempt on a line of its
// own, often the same one twice) keeps each distinct line once. A control
// character left (the flag package echoes a mistyped flag unquoted; an
// escape sequence in it would reach the terminal) is written as its Go
// escape.
func oneLine(err error) string {
	var parts []string
	for _, line := range strings.Split(escapeControls(err.Error()), "\n") {
		if line = strings.Join(strings.Fields(line), " "); line != "" && !slices.Contains(parts, line) {
			parts = append(parts, line)
		}
	}
	var b strings.Builder
	for i, p := range parts {
		if i > 0 {
			if strings.HasSuffix(parts[i-1], ":") {
				b.WriteString(" ")
			} else {
				b.WriteString("; ")
			}
		}
		b.WriteString(p)
	}
	return b.String()
}
