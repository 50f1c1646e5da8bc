// Package settings reads the environment variables shared by the operator CLI
// and the Lambda functions into each component's Config, and validates them
// once, at start, with messages that name the variable at fault.
//
//	s, err := settings.FromEnv(os.Getenv)
//
// Variables lists every variable with its default; the README's configuration
// table is the same list.
package settings

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/database"
	"github.com/idemarchive/idemarchive/shared/keytime"
	"github.com/idemarchive/idemarchive/shared/metrics"
	"github.com/idemarchive/idemarchive/shared/partition"
	"github.com/idemarchive/idemarchive/shared/sweep"
)

// Settings holds one validated Config per component.
type Settings struct {
	Database         database.Config
	MetricsNamespace string
	Sweep            sweep.Config
	Partitions       partition.Config
	Archive          archive.Config
	// PartitionCompactPerRun is how many closed partitions the partitions
	// function compacts per run (partition.Config.CompactPerRun):
	// PARTITION_COMPACT_PER_RUN, default DefaultPartitionCompactPerRun; 0 is
	// honoured and turns compaction off. It is kept out of Partitions, which
	// the migrate function also runs the manager with, so that a deploy
	// never waits for a rebuild nor fails on one.
	PartitionCompactPerRun int
	// ClockSkew is how far ahead of the store's clock a key's timestamp may
	// lie (idempotency.Config.ClockSkew): CLOCK_SKEW, default
	// keytime.DefaultClockSkew; 0 is honoured.
	ClockSkew time.Duration
}

// DefaultPartitionCompactPerRun is PARTITION_COMPACT_PER_RUN's default: one
// closed month is compacted each daily run, so a month is compacted on the
// first run after it is eligible, and an archive that predates compaction
// catches up a month a day.
const DefaultPartitionCompactPerRun = 1

// Variable documents one environment variable.
type Variable struct {
	Name    string
	Default string
	Doc     string
}

// Variables lists every variable FromEnv reads.
var Variables = []Variable{
	{"DATABASE_URL", "(required unless DATABASE_SECRET_ARN)", "PostgreSQL connection string; add search_path=... to use a schema other than public; percent-encode @ / : ? # in the user name and password; with DATABASE_SECRET_ARN it may name the host (then its port, default 5432, is used too), the port, the database and options, and the secret supplies the rest"},
	{"DATABASE_SECRET_ARN", "", "Secrets Manager secret with the RDS-generated JSON (username, password, host, port, dbname); refetched every 5 minutes, and at once (at most every 5 seconds) when a new connection is refused its password after a rotation"},
	{"DATABASE_IAM_AUTH", "false", "mint an RDS IAM auth token for every new connection (RDS Proxy); DATABASE_URL names host, port, user, database"},
	{"DATABASE_INSECURE_TLS", "false", "allow a non-local host without sslmode=verify-full (test rigs only); every host of a multi-host DATABASE_URL is checked"},
	{"DATABASE_SSL_ROOT_CERT", "", "path of a PEM CA bundle (the RDS global-bundle.pem) for direct connections: every connection (every host) uses sslmode=verify-full with it, whatever sslmode DATABASE_URL gives; a DATABASE_URL that sets sslrootcert too is refused"},
	{"DATABASE_MAX_CONNS", "4 (2 in Lambda)", "connection pool size, 1 to 1000"},
	{"DATABASE_EXEC_MODE", "cache_statement", "statement execution mode: cache_statement, cache_describe, describe_exec, exec, simple_protocol (exec or simple_protocol behind RDS Proxy)"},
	{"METRICS_NAMESPACE", metrics.DefaultNamespace, "CloudWatch namespace of the EMF metrics: 1 to 255 of A-Z a-z 0-9 . - _ / # :, not starting with : or AWS/"},
	{"LIVE_TTL", "24h", "how long the live store keeps a key; at least 1s, whole milliseconds"},
	{"MAX_LIVE_TTL", "max(168h, LIVE_TTL)", "longest TTL any writer has used; bounds the partitions an investigation reads; at least LIVE_TTL, whole milliseconds"},
	{"ARCHIVE_STATEMENT_TIMEOUT", "3s", "statement_timeout of each archive lookup and investigation query, shortened to end before the invocation's deadline; whole milliseconds, 1ms to 15m"},
	{"CLOCK_SKEW", "5m", "how far ahead of the store's clock a ULID/UUIDv7 key's timestamp may lie; 0 to 1h, whole milliseconds, 0 allows none; a key further ahead is answered from the archive or refused with 400"},
	{"SWEEP_BATCH_SIZE", "10000", "rows per sweep batch, 1 to 50000"},
	{"SWEEP_PAUSE", "200ms", "pause between batches (jittered by 25%), 0 or 1ms to 15m; 0 means no fixed pause (SWEEP_PAUSE_RATIO still applies: set both to 0 to run flat out)"},
	{"SWEEP_PAUSE_RATIO", "3", "adds this multiple of the time worked since the last pause to the pause after it, so the sweeper works at most about 1/(1+ratio) of the time on average, however slow load makes its batches; a decimal number, 0 to 99; 0 means none (SWEEP_PAUSE alone)"},
	{"SWEEP_IN_FLIGHT_GRACE", "15m", "how long past its expiry a key still in flight stays live before it is archived as expired in flight, 0 to 24h; 0 means none"},
	{"SWEEP_LOCK_TIMEOUT", "2s, or half SWEEP_STATEMENT_TIMEOUT when less", "lock_timeout of each batch; whole milliseconds, 1ms to 15m, shorter than SWEEP_STATEMENT_TIMEOUT (a lock wait must not look like a slow batch)"},
	{"SWEEP_STATEMENT_TIMEOUT", "30s", "statement_timeout of each batch; whole milliseconds, 2ms (the lock timeout must be shorter) to 14m59.999s (at most the deadline margin, which is under 15m)"},
	{"SWEEP_DEADLINE_MARGIN", "SWEEP_STATEMENT_TIMEOUT + 5s, at most 14m59s", "no batch starts when the invocation deadline is closer than this; whole milliseconds, at least SWEEP_STATEMENT_TIMEOUT and under 15m"},
	{"SWEEP_RESOURCE_ID_PATH", "id", "dotted JSON path of the resource id in the stored response"},
	{"SWEEP_MISSING_PARTITION", "create", "create: make a missing month's partition and retry; fail: stop with an error naming the month"},
	{"PARTITION_LEAD_MONTHS", "3", "months ahead of the current one that must have partitions, 2 to 120"},
	{"PARTITION_RETENTION_MONTHS", "0", "whole months kept before the current one, at most 1200; 0 keeps the archive forever"},
	{"PARTITION_LOCK_TIMEOUT", "5s", "lock_timeout of partition DDL; whole milliseconds, 1ms to 15m"},
	{"PARTITION_STATEMENT_TIMEOUT", "2m", "statement_timeout of partition DDL; whole milliseconds, 1ms to 15m"},
	{"PARTITION_COMPACT_PER_RUN", "1", "closed partitions (months that ended before the previous one began) whose primary key the partitions function rebuilds with REINDEX INDEX CONCURRENTLY per run, 0 to 24; 0 turns compaction off; each rebuild may take PARTITION_STATEMENT_TIMEOUT, shortened to end 30 s before the run's deadline"},
}

// FromEnv reads and validates the settings. getenv is os.Getenv outside tests.
func FromEnv(getenv func(string) string) (Settings, error) {
	raw, r := getenv, reader{}
	// Every value is read trimmed, and a variable set to blanks alone is
	// refused: a stray "DATABASE_MAX_CONNS= " in an env file is a mistake,
	// never a request for the default.
	r.getenv = func(name string) string {
		v := raw(name)
		t := strings.TrimSpace(v)
		if v != "" && t == "" {
			r.fail(name, errors.New("is set to blanks only: unset it or give it a value"))
		}
		return t
	}
	getenv = r.getenv
	s := Settings{
		Database: database.Config{
			URL:         getenv("DATABASE_URL"),
			SecretARN:   getenv("DATABASE_SECRET_ARN"),
			IAMAuth:     r.bool("DATABASE_IAM_AUTH"),
			InsecureTLS: r.bool("DATABASE_INSECURE_TLS"),
			SSLRootCert: getenv("DATABASE_SSL_ROOT_CERT"),
			MaxConns:    databaseMaxConns(&r),
			ExecMode:    getenv("DATABASE_EXEC_MODE"),
		},
		MetricsNamespace: getenv("METRICS_NAMESPACE"),
		Sweep: sweep.Config{
			BatchSize:        r.positiveInt("SWEEP_BATCH_SIZE"),
			Pause:            r.pause("SWEEP_PAUSE", sweep.DefaultPause),
			PauseRatio:       r.ratioOr("SWEEP_PAUSE_RATIO", sweep.DefaultPauseRatio),
			InFlightGrace:    r.durationOr("SWEEP_IN_FLIGHT_GRACE", sweep.DefaultInFlightGrace),
			LockTimeout:      r.positiveDuration("SWEEP_LOCK_TIMEOUT"),
			StatementTimeout: r.positiveDuration("SWEEP_STATEMENT_TIMEOUT"),
			DeadlineMargin:   r.wholeMilliseconds(r.positiveDuration, "SWEEP_DEADLINE_MARGIN"),
			ResourceIDPath:   getenv("SWEEP_RESOURCE_ID_PATH"),
		},
		Partitions: partition.Config{
			LeadMonths:       r.positiveInt("PARTITION_LEAD_MONTHS"),
			RetentionMonths:  r.int("PARTITION_RETENTION_MONTHS"),
			LockTimeout:      r.positiveDuration("PARTITION_LOCK_TIMEOUT"),
			StatementTimeout: r.positiveDuration("PARTITION_STATEMENT_TIMEOUT"),
		},
		Archive: archive.Config{
			// Both are counted in whole milliseconds where keys are
			// written (the live store's TTL and the writers' record).
			LiveTTL:    r.wholeMilliseconds(r.positiveDuration, "LIVE_TTL"),
			MaxLiveTTL: r.wholeMilliseconds(r.positiveDuration, "MAX_LIVE_TTL"),
			// Zero would only mean the default: refused when set.
			StatementTimeout: r.positiveDuration("ARCHIVE_STATEMENT_TIMEOUT"),
		},
		PartitionCompactPerRun: r.intOr("PARTITION_COMPACT_PER_RUN", DefaultPartitionCompactPerRun),
		ClockSkew: r.wholeMilliseconds(func(name string) time.Duration {
			return r.durationOr(name, keytime.DefaultClockSkew)
		}, "CLOCK_SKEW"),
	}
	if getenv("SKIP_MARGIN") != "" {
		r.fail("SKIP_MARGIN", errors.New("was removed: the archive skip no longer needs a margin (it is proven from the TTLs and skews writers record); unset it"))
	}
	if err := keytime.ValidateSkew(s.ClockSkew); err != nil && r.err == nil {
		r.fail("CLOCK_SKEW", err)
	}
	switch mode := getenv("SWEEP_MISSING_PARTITION"); strings.ToLower(mode) {
	case "", "create":
	case "fail":
		s.Sweep.FailOnMissingPartition = true
	default:
		r.fail("SWEEP_MISSING_PARTITION", fmt.Errorf("want create or fail, got %q", mode))
	}
	if r.err != nil {
		return s, r.err
	}
	if _, err := s.Database.PoolConfig(); err != nil {
		return s, fmt.Errorf("%s: %w", databaseVariable(err), err)
	}
	if err := metrics.ValidateNamespace(s.MetricsNamespace); err != nil {
		return s, fmt.Errorf("METRICS_NAMESPACE: %w", err)
	}
	if err := s.Sweep.WithDefaults().Validate(); err != nil {
		return s, fmt.Errorf("%s: %w", sweepVariable(err), err)
	}
	if err := checkDeadlineMargin(s.Sweep.WithDefaults(), getenv("SWEEP_DEADLINE_MARGIN") != ""); err != nil {
		return s, err
	}
	compacting := s.Partitions
	compacting.CompactPerRun = s.PartitionCompactPerRun
	if err := compacting.WithDefaults().Validate(); err != nil {
		return s, fmt.Errorf("%s: %w", partitionVariable(err), err)
	}
	if err := s.Archive.WithDefaults().Validate(); err != nil {
		return s, fmt.Errorf("%s: %w", archiveVariable(err), err)
	}
	return s, nil
}

// WithDefaultPoolSize returns s with a pool of n connections where
// DATABASE_MAX_CONNS is unset, checked again against the URL: a component
// whose default pool is not the database package's (4) calls it once at
// start, so that a URL's pool_min_conns above the pool it runs with fails
// there, not at its first connection.
func (s Settings) WithDefaultPoolSize(n int32) (Settings, error) {
	if s.Database.MaxConns != 0 { // set: settings refuses an explicit 0
		return s, nil
	}
	s.Database.MaxConns = n
	if _, err := s.Database.PoolConfig(); err != nil {
		return s, fmt.Errorf("%s: %w", databaseVariable(err), err)
	}
	return s, nil
}

// databaseMaxConns reads DATABASE_MAX_CONNS. Unset is 0, the pool's default.
// Set, it must be 1 to database.MaxMaxConns: an explicit 0 is refused rather
// than read as the default (a pool of no connections cannot work), and a
// value past int32 is refused rather than wrapped.
func databaseMaxConns(r *reader) int32 {
	const name = "DATABASE_MAX_CONNS"
	v := strings.TrimSpace(r.getenv(name))
	if v == "" {
		return 0
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		r.fail(name, errors.New("not a whole number: "+strconv.Quote(v)))
		return 0
	}
	if err != nil || n < 1 || n > database.MaxMaxConns {
		r.fail(name, fmt.Errorf("want 1 to %d connections, got %s", database.MaxMaxConns, v))
		return 0
	}
	return int32(n)
}

// checkDeadlineMargin refuses a deadline margin shorter than the statement
// timeout. The margin is how close to the invocation's deadline a batch may
// still start (sweep.go's shouldStop; a pause and a partition creation also
// end where it begins), and a batch runs for up to the statement timeout: a
// shorter margin lets a batch start that the Lambda timeout then kills,
// losing the run's summary and its metrics. The default, the statement
// timeout + 5s capped at sweep.MaxInvocation - 1s, falls short only when the
// statement timeout is over that cap; then the statement timeout is at fault.
func checkDeadlineMargin(c sweep.Config, marginSet bool) error {
	if c.DeadlineMargin >= c.StatementTimeout {
		return nil
	}
	if marginSet {
		return fmt.Errorf("SWEEP_DEADLINE_MARGIN: must be at least SWEEP_STATEMENT_TIMEOUT (%s), so that a batch that starts has time to finish before the invocation ends; got %s",
			c.StatementTimeout, c.DeadlineMargin)
	}
	advice := fmt.Sprintf("use at most %s, or set SWEEP_DEADLINE_MARGIN between the two and under %s", c.DeadlineMargin, sweep.MaxInvocation)
	if c.StatementTimeout >= sweep.MaxInvocation-time.Millisecond {
		// No margin can be at least the statement timeout and under
		// MaxInvocation.
		advice = fmt.Sprintf("use at most %s", c.DeadlineMargin)
	}
	return fmt.Errorf("SWEEP_STATEMENT_TIMEOUT: %s is longer than the default deadline margin (%s: the statement timeout + 5s, capped under %s), so a batch could start that the invocation's end kills; %s",
		c.StatementTimeout, c.DeadlineMargin, sweep.MaxInvocation, advice)
}

// databaseVariable names the variable behind a database.Config error.
func databaseVariable(err error) string {
	var ce *database.ConfigError
	if errors.As(err, &ce) {
		switch ce.Field {
		case "URL":
			return "DATABASE_URL"
		case "SecretARN":
			return "DATABASE_SECRET_ARN"
		case "IAMAuth":
			return "DATABASE_IAM_AUTH"
		case "SSLRootCert":
			return "DATABASE_SSL_ROOT_CERT"
		case "MaxConns":
			return "DATABASE_MAX_CONNS"
		case "ExecMode":
			return "DATABASE_EXEC_MODE"
		}
	}
	return "DATABASE_*"
}

// sweepVariable names the variable behind a sweep.Config error.
func sweepVariable(err error) string {
	var ce *sweep.ConfigError
	if errors.As(err, &ce) {
		switch ce.Field {
		case "Pause":
			return "SWEEP_PAUSE"
		case "PauseRatio":
			return "SWEEP_PAUSE_RATIO"
		case "InFlightGrace":
			return "SWEEP_IN_FLIGHT_GRACE"
		case "BatchSize":
			return "SWEEP_BATCH_SIZE"
		case "LockTimeout":
			return "SWEEP_LOCK_TIMEOUT"
		case "StatementTimeout":
			return "SWEEP_STATEMENT_TIMEOUT"
		case "DeadlineMargin":
			return "SWEEP_DEADLINE_MARGIN"
		case "ResourceIDPath":
			return "SWEEP_RESOURCE_ID_PATH"
		}
	}
	return "SWEEP_*"
}

// archiveVariable names the variable behind an archive.Config error.
func archiveVariable(err error) string {
	var ce *archive.ConfigError
	if errors.As(err, &ce) {
		switch ce.Field {
		case "LiveTTL":
			return "LIVE_TTL"
		case "MaxLiveTTL":
			return "MAX_LIVE_TTL"
		case "StatementTimeout":
			return "ARCHIVE_STATEMENT_TIMEOUT"
		}
	}
	return "LIVE_TTL/MAX_LIVE_TTL/ARCHIVE_STATEMENT_TIMEOUT"
}

// partitionVariable names the variable behind a partition.Config error.
func partitionVariable(err error) string {
	var ce *partition.ConfigError
	if errors.As(err, &ce) {
		switch ce.Field {
		case "LeadMonths":
			return "PARTITION_LEAD_MONTHS"
		case "RetentionMonths":
			return "PARTITION_RETENTION_MONTHS"
		case "LockTimeout":
			return "PARTITION_LOCK_TIMEOUT"
		case "StatementTimeout":
			return "PARTITION_STATEMENT_TIMEOUT"
		case "CompactPerRun":
			return "PARTITION_COMPACT_PER_RUN"
		}
	}
	return "PARTITION_*"
}

type reader struct {
	getenv func(string) string
	err    error
}

func (r *reader) fail(name string, err error) {
	if r.err == nil {
		r.err = fmt.Errorf("%s: %w", name, err)
	}
}

func (r *reader) int(name string) int {
	v := r.getenv(name)
	if v == "" {
		return 0
	}
	n, err := strconv.Atoi(strings.TrimSpace(v))
	switch {
	case errors.Is(err, strconv.ErrRange):
		r.fail(name, errors.New("out of range: "+strconv.Quote(v)))
	case err != nil:
		r.fail(name, errors.New("not a whole number: "+strconv.Quote(v)))
	}
	return n
}

// intOr is int for a variable whose zero is meaningful: the default applies
// only when the variable is unset, so "0" stays 0.
func (r *reader) intOr(name string, def int) int {
	if r.getenv(name) == "" {
		return def
	}
	return r.int(name)
}

func (r *reader) bool(name string) bool {
	v := r.getenv(name)
	if v == "" {
		return false
	}
	b, err := strconv.ParseBool(strings.TrimSpace(v))
	if err != nil {
		r.fail(name, errors.New("not true or false: "+strconv.Quote(v)))
	}
	return b
}

// positiveInt is int for a variable whose zero would only mean "the default":
// set, it must be positive, so that 0 never silently becomes the default.
func (r *reader) positiveInt(name string) int {
	n := r.int(name)
	if r.getenv(name) != "" && n <= 0 && r.err == nil {
		r.fail(name, fmt.Errorf("must be positive, got %s (unset it for the default)", strconv.Quote(r.getenv(name))))
	}
	return n
}

// positiveDuration is duration for a variable whose zero would only mean
// "the default" (a timeout, a TTL): set, it must be positive, so that 0
// never silently becomes the default nor "no timeout".
func (r *reader) positiveDuration(name string) time.Duration {
	d := r.duration(name)
	if r.getenv(name) != "" && d <= 0 && r.err == nil {
		r.fail(name, fmt.Errorf("must be positive, got %s (unset it for the default)", strconv.Quote(r.getenv(name))))
	}
	return d
}

// ratioOr reads a ratio (ParseRatio), def when unset; its range is the
// component's to check.
func (r *reader) ratioOr(name string, def float64) float64 {
	v := r.getenv(name)
	if v == "" {
		return def
	}
	f, err := ParseRatio(v)
	if err != nil {
		r.fail(name, err)
	}
	return f
}

// plainDecimal is a number as the documentation writes one: digits with
// an optional sign, point and exponent; no hex, no underscores.
var plainDecimal = regexp.MustCompile(`^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$`)

// ParseRatio reads a ratio as every setting and flag of the project does: a
// plain decimal number ("3", "0.5", "1e1"), finite, never silently zero (a
// nonzero value too small for a float64, "1e-400", is refused rather than
// read as none). Hex ("0x1p2"), underscores ("1_0"), NaN and Inf, which
// strconv reads, are refused. Its range is the caller's to check.
func ParseRatio(v string) (float64, error) {
	if !plainDecimal.MatchString(v) {
		return 0, errors.New("not a decimal number: " + strconv.Quote(v))
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsInf(f, 0) {
		return 0, errors.New("out of range: " + strconv.Quote(v))
	}
	if mantissa, _, _ := strings.Cut(strings.ToLower(v), "e"); f == 0 && strings.ContainsAny(mantissa, "123456789") {
		return 0, errors.New("is not 0 but too small to hold: " + strconv.Quote(v))
	}
	if f == 0 {
		f = 0 // -0 is 0
	}
	return f, nil
}

// durationOr is duration for a variable whose zero is meaningful: the
// default applies only when the variable is unset, so "0" stays 0.
func (r *reader) durationOr(name string, def time.Duration) time.Duration {
	if r.getenv(name) == "" {
		return def
	}
	return r.duration(name)
}

func (r *reader) duration(name string) time.Duration {
	v := r.getenv(name)
	if v == "" {
		return 0
	}
	d, err := ParseDuration(v)
	if err != nil {
		r.fail(name, fmt.Errorf("%w: %s", err, strconv.Quote(v)))
	}
	return d
}

// ParseDuration reads a duration as every setting and flag of the project
// does: as time.ParseDuration, except that a well-formed value too long for
// a time.Duration is "out of range", and a nonzero one shorter than a
// nanosecond ("0.0000001ms", which time.ParseDuration reads as 0) is
// refused, so that a value set is never silently zero.
func ParseDuration(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	switch {
	case err != nil && durationSyntax.MatchString(v):
		return 0, errors.New("out of range")
	case err != nil:
		return 0, errors.New("not a duration such as 200ms, 30s or 24h")
	case d == 0 && strings.ContainsAny(v, "123456789"):
		return 0, errors.New("is not 0 but shorter than a nanosecond")
	}
	return d, nil
}

// durationSyntax is what time.ParseDuration accepts, whatever the size.
var durationSyntax = regexp.MustCompile(`^[-+]?(0|((\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h))+)$`)

// wholeMilliseconds is read(name), refused when it is not a whole number of
// milliseconds: the durations read through it are counted in milliseconds
// where they are used, and would be cut short there without a word.
func (r *reader) wholeMilliseconds(read func(string) time.Duration, name string) time.Duration {
	d := read(name)
	if d%time.Millisecond != 0 && r.err == nil {
		down := d.Truncate(time.Millisecond)
		r.fail(name, fmt.Errorf("must be a whole number of milliseconds, got %s: use %s or %s", d, down, down+time.Millisecond))
	}
	return d
}

// pause is durationOr for SWEEP_PAUSE: 0 is no fixed pause, and a pause under a
// millisecond (600µs, 0.5ms: a slip of the unit, next to database round
// trips of a millisecond or more) is refused rather than kept or read as 0.
func (r *reader) pause(name string, def time.Duration) time.Duration {
	d := r.durationOr(name, def)
	if d > 0 && d < time.Millisecond && r.err == nil {
		r.fail(name, fmt.Errorf("must be 0 (no fixed pause) or at least 1ms, got %s", d))
	}
	return d
}

// userInfo matches the user and password of a URL (scheme://user:pass@, up
// to the line's last @: a password pasted unescaped may hold a space, a /
// or an @), and password matches the password of a key=value connection
// string, or of a URL's query, up to the end of the line: libpq allows
// spaces around '=', quoted values with spaces and backslash escapes,
// quoted or not, and an echoed value is escaped once more (%q), so no
// shorter match is sure to end after the password.
//
// encodedKey matches a URL query key written with a percent-escape
// (pass%77ord=, which the driver decodes to password=), up to the end of
// the line as password does: no key the project reads needs one.
//
// jsonPassword matches a member whose name ends in "password" (the
// RDS-generated secret DATABASE_SECRET_ARN names, pasted in its place), up
// to the end of the line for the same reasons: JSON's, its quotes escaped
// or not, a printed Python dict's, YAML's.
var (
	userInfo     = regexp.MustCompile(`([a-zA-Z][a-zA-Z0-9+.-]*://).*@`)
	password     = regexp.MustCompile(`(?i)(password` + blanks + `=).*`)
	encodedKey   = regexp.MustCompile(`([?&][^=&\s]*%[0-9A-Fa-f]{2}[^=&\s]*=).*`)
	jsonPassword = regexp.MustCompile(`(?i)(password\\*["']?` + blanks + `:).*`)
)

// blanks matches what may stand between a password's key and its '=' or
// ':': the blanks libpq trims around a key (space, \t, \n, \r, \v, \f), raw
// or as an echo with %q writes them (\t, or \\t echoed twice).
const blanks = `(?:[\t\n\v\f\r ]|\\+[tnrvf])*`

// Redact hides the user and password of any connection string, and the
// password of a secret's JSON, in an error line: a value echoed back may be
// one, pasted into the wrong variable (DATABASE_EXEC_MODE=postgres://u:pw@h/db). It may hide more than that (an
// ordinary value holding "://" and "@"), never less.
func Redact(line string) string {
	line = userInfo.ReplaceAllString(line, "${1}REDACTED@")
	line = password.ReplaceAllString(line, "${1}REDACTED")
	line = encodedKey.ReplaceAllString(line, "${1}REDACTED")
	return jsonPassword.ReplaceAllString(line, "${1}REDACTED")
}
