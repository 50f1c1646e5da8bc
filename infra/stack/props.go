package stack

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/aws/aws-cdk-go/awscdk/v2"

	"github.com/idemarchive/idemarchive/shared/metrics"
	"github.com/idemarchive/idemarchive/shared/partition"
	"github.com/idemarchive/idemarchive/shared/settings"
)

// FunctionNames are the deployment packages the stack needs in
// Props.CodeDir: <name>.zip, as `make build` writes them to bin/.
var FunctionNames = []string{"sweep", "partitions", "lookup", "migrate"}

// Props is everything an operator changes. The zero value of every field but
// CodeDir means its documented default; a pointer tells "unset" from a
// meaningful zero or false.
type Props struct {
	awscdk.StackProps

	// CodeDir holds <function>.zip for every name in FunctionNames. Required.
	// `make synth` points it at bin/; tests at placeholder zips.
	CodeDir string

	// LiveTTL is how long the live store keeps a key (LIVE_TTL). Default 24h.
	LiveTTL time.Duration
	// MaxLiveTTL is the longest TTL any writer has used (MAX_LIVE_TTL).
	// Default 168h, or LiveTTL when that is longer.
	MaxLiveTTL time.Duration
	// PartitionLeadMonths is how many months ahead partitions must exist
	// (PARTITION_LEAD_MONTHS). Default 3; at least 2.
	PartitionLeadMonths int
	// PartitionRetentionMonths is how many whole months before the current
	// one are kept (PARTITION_RETENTION_MONTHS). Default 0: keep everything,
	// which is what an audit archive usually wants.
	PartitionRetentionMonths int
	// SweepInterval is how often the sweeper runs, in whole minutes from 2
	// to 60. Default 5 minutes. The sweeper's timeout is one minute less, so
	// a run that starts on time ends before the next starts (one delivered
	// late runs beside it, which SKIP LOCKED makes safe).
	SweepInterval time.Duration
	// SweepBatchSize is the number of rows per sweep batch
	// (SWEEP_BATCH_SIZE). Default 10000.
	SweepBatchSize int
	// SweepPause is the pause between sweep batches (SWEEP_PAUSE). Nil: the
	// function's default (200ms); zero: no fixed pause (SweepPauseRatio
	// still applies).
	SweepPause *time.Duration
	// SweepPauseRatio adds that multiple of the time worked since the last
	// pause to the pause after it (SWEEP_PAUSE_RATIO), so the sweeper works
	// at most about 1/(1+ratio) of a run on average. Nil: the function's default (3);
	// zero: none.
	SweepPauseRatio *float64
	// SweepInFlightGrace is how long past its expiry a key still in flight
	// stays live (SWEEP_IN_FLIGHT_GRACE). Nil: the function's default (15m);
	// zero: none.
	SweepInFlightGrace *time.Duration
	// SweepStatementTimeout, SweepLockTimeout and SweepDeadlineMargin bound
	// each sweep batch and where a run stops starting them
	// (SWEEP_STATEMENT_TIMEOUT, SWEEP_LOCK_TIMEOUT, SWEEP_DEADLINE_MARGIN).
	// Zero: the function's defaults (30s; 2s or half the statement timeout;
	// the statement timeout + 5s). The margin must leave at least
	// MinSweepWindow of the sweep's timeout to start batches in.
	SweepStatementTimeout, SweepLockTimeout, SweepDeadlineMargin time.Duration
	// SweepResourceIDPath is the dotted JSON path of the resource id in the
	// stored responses (SWEEP_RESOURCE_ID_PATH). Default "id".
	SweepResourceIDPath string
	// PartitionStatementTimeout and PartitionLockTimeout bound each
	// partition DDL statement (PARTITION_STATEMENT_TIMEOUT,
	// PARTITION_LOCK_TIMEOUT). Zero: the function's defaults (2m, 5s). The
	// partitions function's timeout grows with the statement timeout (see
	// partitionsTimeout), so at most MaxPartitionStatementTimeout.
	PartitionStatementTimeout, PartitionLockTimeout time.Duration
	// PartitionCompactPerRun is how many closed months the partitions
	// function compacts per run (PARTITION_COMPACT_PER_RUN). Nil: the
	// function's default (1); zero: compaction off.
	PartitionCompactPerRun *int

	// LookupReservedConcurrency reserves that many concurrent executions of
	// the account's for the lookup function (and caps it there), so that
	// other functions of the account cannot take the lookup's share while a
	// payment waits on it. Nil: none reserved. At least 1 when set (0 would
	// throttle every lookup).
	LookupReservedConcurrency *int
	// LookupProvisionedConcurrency keeps that many lookup instances
	// initialized (no cold start on the payment path, billed while
	// provisioned) on the alias LookupAlias, which the API and the
	// LookupFunctionName output then name. Default 0: none, no alias. Less
	// than LookupReservedConcurrency when that is set: as much would
	// throttle every invocation of the unqualified name, and leave none for
	// invocations past the provisioned instances.
	LookupProvisionedConcurrency int

	// AlarmEmail, when set, is subscribed to the alarm topic the stack
	// creates (it must confirm the subscription). One address: for several
	// recipients, subscribe them to a topic of your own and set
	// AlarmTopicArn.
	AlarmEmail string
	// AlarmTopicArn sends every alarm to an existing SNS topic instead of a
	// topic the stack creates. AlarmEmail must then be empty.
	AlarmTopicArn string
	// NotifyTopicArn receives the alarms that inform rather than page
	// (expired replays, archive bytes per row, throttles). Default: the
	// alarm topic.
	NotifyTopicArn string
	// ArchiveBytesPerRowBaseline is the measured size of one archive row,
	// indexes included, in bytes. The alarm fires at twice this. Default 270,
	// measured with pg_total_relation_size over the partitions (what
	// idempotency_archive_bytes reports) on PostgreSQL 15 after 200,000 rows
	// of 45-byte scoped keys and 27-byte resource ids: the runbook's 110
	// bytes of data per row, plus the tuple header and line pointer, plus the
	// primary key index on (scoped_key, expired_at). Measure your own keys.
	ArchiveBytesPerRowBaseline float64

	// InstanceType is the RDS instance class without its "db." prefix.
	// Default t4g.small. Refused with Aurora (the cluster is sized by
	// AuroraMinCapacity and AuroraMaxCapacity).
	InstanceType string
	// DeletionProtection protects the database (and keeps a snapshot when the
	// stack is deleted). Default true.
	DeletionProtection *bool
	// MultiAZ adds a standby instance in another availability zone (twice
	// the instance cost). Default false. Refused with Aurora.
	MultiAZ bool
	// Aurora deploys an Aurora PostgreSQL Serverless v2 cluster instead of an
	// RDS instance, for archives that outgrow one instance's storage and I/O.
	Aurora bool
	// AuroraMinCapacity and AuroraMaxCapacity bound the cluster's ACUs.
	// Defaults 0.5 and 4. Refused without Aurora.
	AuroraMinCapacity, AuroraMaxCapacity float64
	// RotateMasterSecret rotates the generated master password every 30 days
	// with the AWS-provided rotation function. Default true (LocalStack sets
	// false: it has no Serverless Application Repository).
	RotateMasterSecret *bool

	// MetricsNamespace is the CloudWatch namespace of the functions' metrics
	// and of every alarm on them (METRICS_NAMESPACE). Default the code's
	// metrics.DefaultNamespace. Services running the idempotency middleware
	// must emit idempotency_expired_replay_total under the same namespace.
	MetricsNamespace string
	// LogRetentionDays is how long the functions' and the API's logs are
	// kept. Default 90; must be a value CloudWatch Logs accepts.
	LogRetentionDays int
	// APIRateLimit and APIBurstLimit throttle the HTTP API's default stage
	// (requests per second, and burst). Defaults 200 and 400.
	APIRateLimit, APIBurstLimit float64
	// APIInvestigationRateLimit and APIInvestigationBurstLimit throttle the
	// investigation route (GET /v1/archive/keys) on its own, below the
	// stage: investigations run on the lookup function, whose concurrency
	// the payment path's lookups need, and each may take its statement
	// timeout. Defaults 10 and 20, or the stage's limits when lower.
	APIInvestigationRateLimit, APIInvestigationBurstLimit float64
}

// Database user names, one per function: each connects through the proxy as
// its own user, granted the matching least-privilege role of shared/schema.
const (
	MasterUser   = "postgres"
	DatabaseName = "idemarchive"
	SweeperUser  = "idemarchive_sweeper"
	ReaderUser   = "idemarchive_reader"
	OwnerUser    = "idemarchive_owner"
	// WriterUser is the user of the API services' Postgres live store
	// (idempotency_writer); see Stack.GrantWriterConnect.
	WriterUser = "idemarchive_api"
)

// withDefaults returns p with every unset field at its default.
func (p Props) withDefaults() Props {
	def := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	def(&p.LiveTTL, 24*time.Hour)
	if p.MaxLiveTTL == 0 {
		// As the functions default it: a longer LiveTTL needs no
		// MaxLiveTTL of its own.
		p.MaxLiveTTL = max(168*time.Hour, p.LiveTTL)
	}
	def(&p.SweepInterval, 5*time.Minute)
	if p.PartitionLeadMonths == 0 {
		p.PartitionLeadMonths = 3
	}
	if p.SweepBatchSize == 0 {
		p.SweepBatchSize = 10000
	}
	if p.ArchiveBytesPerRowBaseline == 0 {
		p.ArchiveBytesPerRowBaseline = 270
	}
	if p.InstanceType == "" {
		p.InstanceType = "t4g.small"
	}
	if p.DeletionProtection == nil {
		p.DeletionProtection = ptr(true)
	}
	if p.RotateMasterSecret == nil {
		p.RotateMasterSecret = ptr(true)
	}
	if p.AuroraMinCapacity == 0 {
		p.AuroraMinCapacity = 0.5
	}
	if p.AuroraMaxCapacity == 0 {
		p.AuroraMaxCapacity = 4
	}
	if p.MetricsNamespace == "" {
		p.MetricsNamespace = metrics.DefaultNamespace
	}
	if p.LogRetentionDays == 0 {
		p.LogRetentionDays = 90
	}
	if p.APIRateLimit == 0 {
		p.APIRateLimit = 200
	}
	if p.APIBurstLimit == 0 {
		p.APIBurstLimit = 400
	}
	// The defaults follow a stage throttled below them.
	if p.APIInvestigationRateLimit == 0 {
		p.APIInvestigationRateLimit = min(10, p.APIRateLimit)
	}
	if p.APIInvestigationBurstLimit == 0 {
		p.APIInvestigationBurstLimit = min(20, p.APIBurstLimit)
	}
	return p
}

// validate checks p as given, before anything is built, so that a bad value
// fails the synth with a message naming it rather than a deploy. Whether a
// setting is used is judged on the value given, the rest with the defaults
// filled in (withDefaults fills InstanceType and the Aurora capacities
// whatever the deployment, so it would hide a value the caller set).
func (p Props) validate() error {
	if p.CodeDir == "" {
		return errors.New("CodeDir is required: the directory holding <function>.zip (make build writes bin/)")
	}
	for _, fn := range FunctionNames {
		zip := filepath.Join(p.CodeDir, fn+".zip")
		if _, err := os.Stat(zip); err != nil {
			return fmt.Errorf("deployment package %s is missing (run make build): %w", zip, err)
		}
	}
	// A setting the deployment would not use is refused, never deployed
	// as if honoured: stack.New's callers get what the context's get from
	// propsFromContext.
	switch {
	case p.Aurora && p.InstanceType != "":
		return fmt.Errorf("InstanceType %q is not used with Aurora (a Serverless v2 cluster is sized by AuroraMinCapacity and AuroraMaxCapacity): leave it empty", p.InstanceType)
	case p.Aurora && p.MultiAZ:
		return errors.New("MultiAZ is not used with Aurora (one Serverless v2 writer, no reader): leave it false")
	case !p.Aurora && p.AuroraMinCapacity != 0:
		return fmt.Errorf("AuroraMinCapacity %v is used only with Aurora: leave it 0", p.AuroraMinCapacity)
	case !p.Aurora && p.AuroraMaxCapacity != 0:
		return fmt.Errorf("AuroraMaxCapacity %v is used only with Aurora: leave it 0", p.AuroraMaxCapacity)
	case p.AlarmTopicArn != "" && p.AlarmEmail != "":
		return errors.New("AlarmEmail is not subscribed with AlarmTopicArn set (the stack creates no topic then): subscribe it to that topic, or leave AlarmTopicArn empty")
	}
	if p.AlarmEmail != "" && !oneAddress(p.AlarmEmail) {
		// SNS would refuse the subscription at deploy ("Invalid parameter:
		// Email address"), rolling the whole deploy back.
		return fmt.Errorf("AlarmEmail (context alarmEmail) must be one e-mail address, name@domain, with no blanks, commas, semicolons or angle brackets, got %q: "+
			"for several recipients, subscribe them to a topic of your own and set AlarmTopicArn (context alarmTopicArn) instead", p.AlarmEmail)
	}
	p = p.withDefaults()
	if p.SweepInterval%time.Minute != 0 || p.SweepInterval < 2*time.Minute || p.SweepInterval > time.Hour {
		return fmt.Errorf("SweepInterval must be whole minutes from 2 to 60, got %s", p.SweepInterval)
	}
	// Each check below names the first value it refuses, in the order
	// written (a map's would vary from run to run).
	for _, b := range []named[float64]{
		{"ArchiveBytesPerRowBaseline", p.ArchiveBytesPerRowBaseline}, {"AuroraMinCapacity", p.AuroraMinCapacity},
		{"AuroraMaxCapacity", p.AuroraMaxCapacity}, {"APIRateLimit", p.APIRateLimit}, {"APIBurstLimit", p.APIBurstLimit},
		{"APIInvestigationRateLimit", p.APIInvestigationRateLimit}, {"APIInvestigationBurstLimit", p.APIInvestigationBurstLimit},
	} {
		if math.IsNaN(b.v) || math.IsInf(b.v, 0) || b.v < 0 {
			return fmt.Errorf("%s must be a positive finite number (or 0 for the default), got %v", b.name, b.v)
		}
	}
	if p.ArchiveBytesPerRowBaseline > MaxArchiveBytesPerRowBaseline {
		return fmt.Errorf("ArchiveBytesPerRowBaseline must be at most %d bytes (a row holds a key of at most 2,000 bytes and an id of at most 255), got %v", MaxArchiveBytesPerRowBaseline, p.ArchiveBytesPerRowBaseline)
	}
	if !instanceClass.MatchString(p.InstanceType) || strings.HasPrefix(p.InstanceType, "db.") {
		return fmt.Errorf("InstanceType must be an instance class without its db. prefix, such as t4g.small or r7g.large, got %q", p.InstanceType)
	}
	for _, b := range []named[string]{{"AlarmTopicArn", p.AlarmTopicArn}, {"NotifyTopicArn", p.NotifyTopicArn}} {
		if b.v != "" && !topicARN.MatchString(b.v) {
			return fmt.Errorf("%s must be an SNS topic's ARN, arn:<partition>:sns:<region>:<account>:<name>, got %q", b.name, b.v)
		}
	}
	if err := metrics.ValidateNamespace(p.MetricsNamespace); err != nil {
		return fmt.Errorf("MetricsNamespace: %w", err)
	}
	if strings.ContainsRune(p.MetricsNamespace, ':') {
		// The lookup's 5xx count is a metric filter's, whose namespace
		// CloudWatch Logs refuses with a ':'; the alarms would watch a
		// namespace nothing writes to.
		return fmt.Errorf("MetricsNamespace %q holds a ':', which a CloudWatch Logs metric filter's namespace may not", p.MetricsNamespace)
	}
	if p.AuroraMinCapacity < 0.5 {
		return fmt.Errorf("AuroraMinCapacity must be at least 0.5 ACU, got %v: auto-pause (0) is not offered, as the schedules and RDS Proxy keep the cluster awake and a resume would outlast the lookup's timeout", p.AuroraMinCapacity)
	}
	if p.AuroraMinCapacity > p.AuroraMaxCapacity {
		return fmt.Errorf("AuroraMinCapacity %.1f is above AuroraMaxCapacity %.1f", p.AuroraMinCapacity, p.AuroraMaxCapacity)
	}
	// Aurora Serverless v2's own bounds, said here rather than as a jsii
	// panic at synth or a failed deploy.
	for _, b := range []named[float64]{{"AuroraMinCapacity", p.AuroraMinCapacity}, {"AuroraMaxCapacity", p.AuroraMaxCapacity}} {
		if b.v > 256 || math.Mod(b.v, 0.5) != 0 {
			return fmt.Errorf("%s must be a multiple of 0.5 ACU, at most 256, got %v", b.name, b.v)
		}
	}
	if p.AuroraMaxCapacity < 1 {
		return fmt.Errorf("AuroraMaxCapacity must be at least 1 ACU (Aurora Serverless v2's least maximum), got %v", p.AuroraMaxCapacity)
	}
	// CloudFormation types a burst limit as an integer.
	for _, b := range []named[float64]{{"APIBurstLimit", p.APIBurstLimit}, {"APIInvestigationBurstLimit", p.APIInvestigationBurstLimit}} {
		if b.v != math.Trunc(b.v) || b.v > math.MaxInt32 {
			return fmt.Errorf("%s must be a whole number of requests, at most %d, got %v", b.name, math.MaxInt32, b.v)
		}
	}
	if p.APIInvestigationRateLimit > p.APIRateLimit || p.APIInvestigationBurstLimit > p.APIBurstLimit {
		return fmt.Errorf("APIInvestigationRateLimit and APIInvestigationBurstLimit (context apiInvestigationRateLimit, apiInvestigationBurstLimit: %v, %v) must be at most APIRateLimit and APIBurstLimit (%v, %v): the route's throttle replaces the stage's for it",
			p.APIInvestigationRateLimit, p.APIInvestigationBurstLimit, p.APIRateLimit, p.APIBurstLimit)
	}
	for _, b := range []named[time.Duration]{{"PartitionStatementTimeout", p.PartitionStatementTimeout}, {"PartitionLockTimeout", p.PartitionLockTimeout}} {
		if b.v > MaxPartitionStatementTimeout {
			return fmt.Errorf("%s must be at most %s, so that one DDL statement ends with time for the rest of the run before the partitions function's %s limit; got %s",
				b.name, MaxPartitionStatementTimeout, maxFunctionTimeout, b.v)
		}
	}
	if r := p.LookupReservedConcurrency; r != nil && *r < 1 {
		return fmt.Errorf("LookupReservedConcurrency must be at least 1 when set, got %d (0 would throttle every lookup; leave it unset to reserve none)", *r)
	}
	if n := p.LookupProvisionedConcurrency; n < 0 || (p.LookupReservedConcurrency != nil && n >= *p.LookupReservedConcurrency) {
		return fmt.Errorf("LookupProvisionedConcurrency must be 0 or more, and less than LookupReservedConcurrency when that is set (as much throttles every invocation of the unqualified name and leaves none past the provisioned instances), got %d", n)
	}
	if n := p.envBytes(); n > maxEnvBytes {
		return fmt.Errorf("the functions' environment would take %d bytes (SweepResourceIDPath %d of them), over the %d Lambda accepts with room for DATABASE_URL",
			n, len(p.SweepResourceIDPath), maxEnvBytes)
	}
	if _, ok := retentionDays[p.LogRetentionDays]; !ok {
		return fmt.Errorf("LogRetentionDays %d is not a retention CloudWatch Logs offers", p.LogRetentionDays)
	}
	// The functions validate their configuration at start; running the same
	// validation here turns a bad value into a synth error instead of a
	// function that fails every invocation after the deploy.
	fs, err := p.functionSettings()
	if err != nil {
		return fmt.Errorf("function configuration: %w", err)
	}
	// The sweep starts batches only while its deadline is further than the
	// margin: a margin that eats its timeout leaves a schedule whose runs
	// start a batch or two, or none (and fail, as a run that could start no
	// batch while keys wait does).
	if window := p.sweepTimeout() - fs.Sweep.WithDefaults().DeadlineMargin; window < MinSweepWindow {
		return fmt.Errorf("the sweep's deadline margin (%s: SweepDeadlineMargin, by default SweepStatementTimeout + 5s) leaves %s of its %s timeout (SweepInterval less a minute) to start batches in, under %s: shorten them or lengthen SweepInterval",
			fs.Sweep.WithDefaults().DeadlineMargin, window, p.sweepTimeout(), MinSweepWindow)
	}
	return nil
}

// MaxArchiveBytesPerRowBaseline bounds ArchiveBytesPerRowBaseline: the
// bytes-per-row alarm's threshold is a multiple of it, which must stay a
// finite number.
const MaxArchiveBytesPerRowBaseline = 100_000

// oneAddress reports whether s is one e-mail address as an SNS email
// subscription takes it: exactly one '@', a local part, and a domain of
// non-empty dot-separated labels, without blanks, control characters or the
// separators of an address list (',', ';', '<', '>'). It refuses what an
// operator paging two people would try; SNS judges the rest.
func oneAddress(s string) bool {
	local, domain, ok := strings.Cut(s, "@")
	if !ok || local == "" || strings.Contains(domain, "@") || slices.Contains(strings.Split(domain, "."), "") {
		return false
	}
	return !strings.ContainsFunc(s, func(r rune) bool {
		return unicode.IsSpace(r) || unicode.IsControl(r) || strings.ContainsRune(",;<>", r) || r == utf8.RuneError
	})
}

// instanceClass matches an RDS instance class without its db. prefix.
var instanceClass = regexp.MustCompile(`^[a-z][a-z0-9-]*\.[a-z0-9]+$`)

// topicARN matches an SNS topic's ARN.
var topicARN = regexp.MustCompile(`^arn:[a-z0-9-]+:sns:[a-z0-9-]+:[0-9]{12}:[A-Za-z0-9_-]{1,256}(\.fifo)?$`)

// MinSweepWindow is the least time a sweep run must have to start batches
// in: its timeout less its deadline margin.
const MinSweepWindow = 10 * time.Second

// maxFunctionTimeout is Lambda's limit.
const maxFunctionTimeout = 15 * time.Minute

// MaxPartitionStatementTimeout is the longest PartitionStatementTimeout and
// PartitionLockTimeout: the partitions function's timeout is the longer of
// the two plus partitionsSlack, within Lambda's limit.
const MaxPartitionStatementTimeout = maxFunctionTimeout - partitionsSlack

// maxEnvBytes is what the shared settings may take of a function's
// environment: Lambda refuses more than 4 KB of names and values in all,
// and DATABASE_URL (the proxy's endpoint), the database flags and a
// function's own variables need the rest.
const maxEnvBytes = 4096 - 768

// envBytes is the size of the shared settings' names and values.
func (p Props) envBytes() int {
	n := 0
	for k, v := range p.settingsEnv() {
		n += len(k) + len(v)
	}
	return n
}

// partitionsSlack is what a partitions run has besides its one longest DDL
// statement: connecting, the other (short) statements, the cleanup that
// compaction leaves 30 s for, and the summary.
const partitionsSlack = 2 * time.Minute

// partitionsTimeout is the partitions function's timeout, in whole seconds
// (Lambda's unit): 5 minutes, or the longest a DDL statement may run plus
// partitionsSlack when longer, so that a run whose one DDL statement runs
// its whole timeout is not cut off by Lambda (which would lose the run's
// summary and metrics, and leave a DETACH CONCURRENTLY for the next run to
// finish). The longest is the statement timeout, or the lock timeout when
// longer: the drop of an interrupted rebuild's index is given the longer
// of the two. Rebuilds and plain-key pruning are shortened to the run's
// deadline; creating and detaching months are not, so a run that meets
// several statements each near its timeout can still outlast it.
func (p Props) partitionsTimeout() time.Duration {
	def := partition.Config{}.WithDefaults()
	longest := max(cmp.Or(p.PartitionStatementTimeout, def.StatementTimeout), cmp.Or(p.PartitionLockTimeout, def.LockTimeout))
	d := min(max(5*time.Minute, longest+partitionsSlack), maxFunctionTimeout)
	if r := d % time.Second; r != 0 {
		d += time.Second - r
	}
	return d
}

// functionSettings is the configuration the functions read from the
// environment the stack gives them, as shared/settings reads it.
func (p Props) functionSettings() (settings.Settings, error) {
	env := p.settingsEnv()
	env["DATABASE_URL"] = "postgres://" + SweeperUser + "@proxy.invalid:5432/" + DatabaseName + "?sslmode=verify-full"
	env["DATABASE_IAM_AUTH"] = "true"
	env["DATABASE_EXEC_MODE"] = execMode
	return settings.FromEnv(func(k string) string { return env[k] })
}

// execMode is the statement execution mode behind RDS Proxy: "exec" prepares
// no named statements, which would pin every session to one database
// connection and defeat the proxy's pooling.
const execMode = "exec"

// settingsEnv is the configuration every function shares, as the environment
// variables of shared/settings.
// A prop left unset (nil, or zero where zero means the default) sets no
// variable, so the function's own default applies.
func (p Props) settingsEnv() map[string]string {
	env := map[string]string{
		"METRICS_NAMESPACE":          p.MetricsNamespace,
		"LIVE_TTL":                   p.LiveTTL.String(),
		"MAX_LIVE_TTL":               p.MaxLiveTTL.String(),
		"SWEEP_BATCH_SIZE":           strconv.Itoa(p.SweepBatchSize),
		"PARTITION_LEAD_MONTHS":      strconv.Itoa(p.PartitionLeadMonths),
		"PARTITION_RETENTION_MONTHS": strconv.Itoa(p.PartitionRetentionMonths),
	}
	// Set even when zero: zero is a setting of its own (no fixed pause, no ratio, no
	// grace, no compaction).
	if p.SweepPause != nil {
		env["SWEEP_PAUSE"] = p.SweepPause.String()
	}
	if p.SweepPauseRatio != nil {
		env["SWEEP_PAUSE_RATIO"] = strconv.FormatFloat(*p.SweepPauseRatio, 'g', -1, 64)
	}
	if p.SweepInFlightGrace != nil {
		env["SWEEP_IN_FLIGHT_GRACE"] = p.SweepInFlightGrace.String()
	}
	if p.PartitionCompactPerRun != nil {
		env["PARTITION_COMPACT_PER_RUN"] = strconv.Itoa(*p.PartitionCompactPerRun)
	}
	// Zero is refused by the functions, so here it means "unset". A
	// negative value is passed on for the functions' validation to refuse.
	for name, d := range map[string]time.Duration{
		"SWEEP_STATEMENT_TIMEOUT": p.SweepStatementTimeout, "SWEEP_LOCK_TIMEOUT": p.SweepLockTimeout,
		"SWEEP_DEADLINE_MARGIN": p.SweepDeadlineMargin, "PARTITION_STATEMENT_TIMEOUT": p.PartitionStatementTimeout,
		"PARTITION_LOCK_TIMEOUT": p.PartitionLockTimeout,
	} {
		if d != 0 {
			env[name] = d.String()
		}
	}
	if p.SweepResourceIDPath != "" {
		env["SWEEP_RESOURCE_ID_PATH"] = p.SweepResourceIDPath
	}
	return env
}

// sweepTimeout is one minute less than the interval: a run that starts on
// time ends before the next one starts, so scheduled runs do not overlap
// (two sweepers only compete for the same I/O). A run delivered late (up to
// an interval in EventBridge's retries and one in Lambda's queue) can run
// beside the next, which is safe: batches claim rows with SKIP LOCKED.
// Lambda's limit is 15 minutes.
func (p Props) sweepTimeout() time.Duration {
	return min(p.SweepInterval-time.Minute, 15*time.Minute)
}

func ptr[T any](v T) *T { return &v }

// logRemoval is what deleting the stack does to the functions' log groups
// and the API's access log: kept (with their retention) where the database
// is protected, since they are how an investigation finds who read the
// archive and what each run did; deleted with it otherwise.
func logRemoval(p Props) awscdk.RemovalPolicy {
	if p.DeletionProtection != nil && *p.DeletionProtection {
		return awscdk.RemovalPolicy_RETAIN
	}
	return awscdk.RemovalPolicy_DESTROY
}

// named is a prop's value with its name, for checks that must name the
// first value they refuse in a fixed order.
type named[T any] struct {
	name string
	v    T
}
