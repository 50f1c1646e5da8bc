package main

import (
	"errors"
	"fmt"
	"math"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/jsii-runtime-go"

	"github.com/idemarchive/idemarchive/infra/stack"
	"github.com/idemarchive/idemarchive/shared/settings"
)

// DefaultStackName is the stack's name unless the context sets stackName.
const DefaultStackName = "IdempotencyArchive"

// propsFromContext reads the stack's props from CDK context values. Every
// value may be a string (from -c name=value) or, from cdk.json, a JSON
// number or boolean.
func propsFromContext(get func(*string) any) (stack.Props, string, error) {
	c := contextReader{get: get}
	p := stack.Props{
		CodeDir:                      c.str("codeDir", "../bin"),
		LiveTTL:                      c.duration("liveTtl"),
		MaxLiveTTL:                   c.duration("maxLiveTtl"),
		PartitionLeadMonths:          c.int("partitionLeadMonths"),
		PartitionRetentionMonths:     c.int("partitionRetentionMonths"),
		SweepInterval:                c.duration("sweepInterval"),
		SweepBatchSize:               c.int("sweepBatchSize"),
		SweepPause:                   c.durationPtr("sweepPause"),
		SweepPauseRatio:              c.ratioPtr("sweepPauseRatio"),
		SweepInFlightGrace:           c.durationPtr("sweepInFlightGrace"),
		SweepStatementTimeout:        c.duration("sweepStatementTimeout"),
		SweepLockTimeout:             c.duration("sweepLockTimeout"),
		SweepDeadlineMargin:          c.duration("sweepDeadlineMargin"),
		SweepResourceIDPath:          c.str("sweepResourceIdPath", ""),
		PartitionStatementTimeout:    c.duration("partitionStatementTimeout"),
		PartitionLockTimeout:         c.duration("partitionLockTimeout"),
		PartitionCompactPerRun:       c.intPtr("partitionCompactPerRun"),
		AlarmEmail:                   c.str("alarmEmail", ""),
		AlarmTopicArn:                c.str("alarmTopicArn", ""),
		NotifyTopicArn:               c.str("notifyTopicArn", ""),
		ArchiveBytesPerRowBaseline:   c.float("archiveBytesPerRowBaseline"),
		InstanceType:                 c.str("instanceType", ""),
		DeletionProtection:           c.boolPtr("deletionProtection"),
		MultiAZ:                      c.bool("multiAz"),
		Aurora:                       c.bool("aurora"),
		AuroraMinCapacity:            c.float("auroraMinCapacity"),
		AuroraMaxCapacity:            c.float("auroraMaxCapacity"),
		RotateMasterSecret:           c.boolPtr("rotateMasterSecret"),
		MetricsNamespace:             c.str("metricsNamespace", ""),
		LogRetentionDays:             c.int("logRetentionDays"),
		APIRateLimit:                 c.float("apiRateLimit"),
		LookupReservedConcurrency:    c.intPtr("lookupReservedConcurrency"),
		LookupProvisionedConcurrency: c.int("lookupProvisionedConcurrency"),
		APIBurstLimit:                c.float("apiBurstLimit"),
		APIInvestigationRateLimit:    c.float("apiInvestigationRateLimit"),
		APIInvestigationBurstLimit:   c.float("apiInvestigationBurstLimit"),
	}
	// A setting the chosen deployment does not use is refused, never
	// deployed as if it were honoured.
	switch {
	case p.Aurora && c.given("instanceType"):
		c.fail("instanceType", errors.New("is not used with aurora=true: an Aurora Serverless v2 cluster is sized by auroraMinCapacity and auroraMaxCapacity; leave it out"))
	case p.Aurora && p.MultiAZ:
		c.fail("multiAz", errors.New("is not used with aurora=true: the stack deploys one Aurora Serverless v2 writer and no reader; leave it out"))
	case !p.Aurora && c.given("auroraMinCapacity"):
		c.fail("auroraMinCapacity", errors.New("is used only with aurora=true; leave it out"))
	case !p.Aurora && c.given("auroraMaxCapacity"):
		c.fail("auroraMaxCapacity", errors.New("is used only with aurora=true; leave it out"))
	case p.AlarmTopicArn != "" && p.AlarmEmail != "":
		c.fail("alarmEmail", errors.New("is not subscribed with alarmTopicArn set (the stack creates no topic then): subscribe it to that topic, or leave alarmTopicArn out"))
	}
	// The CLI sets these from the credentials in use; make synth leaves the
	// stack environment-agnostic.
	if acct, region := os.Getenv("CDK_DEFAULT_ACCOUNT"), os.Getenv("CDK_DEFAULT_REGION"); acct != "" && region != "" {
		p.Env = &awscdk.Environment{Account: jsii.String(acct), Region: jsii.String(region)}
	}
	name := c.str("stackName", DefaultStackName)
	if c.err == nil && (len(name) > 128 || !stackName.MatchString(name)) {
		c.fail("stackName", fmt.Errorf("%q is no CloudFormation stack name: a letter, then letters, digits and '-', at most 128 characters", name))
	}
	return p, name, c.err
}

// stackName matches the names CloudFormation takes for a stack.
var stackName = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9-]*$`)

// contextKeys are the context keys propsFromContext reads.
func contextKeys() []string {
	var keys []string
	_, _, _ = propsFromContext(func(name *string) any {
		keys = append(keys, *name)
		return nil
	})
	return keys
}

// ourKey matches a key shaped like the stack's own (a plain camelCase
// name). The CDK's own keys and its lookups' (aws:cdk:..., @aws-cdk/...,
// availability-zones:...) and other tools' (acknowledged-issue-numbers)
// hold ':', '/', '@' or '-'.
var ourKey = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9]*$`)

// checkContextKeys refuses a context key shaped like the stack's own that
// is none of them: a misspelt key (alarmEmial, deletionprotection) would
// otherwise deploy the default without a word. The error names the key it
// most likely meant. A key spelt in another case style (sweep_interval,
// sweep-interval) is refused too, naming the key it spells.
func checkContextKeys(all map[string]any) error {
	known := contextKeys()
	var unknown []string
	for k := range all {
		if ourKey.MatchString(k) && !slices.Contains(known, k) {
			unknown = append(unknown, k)
		}
	}
	slices.Sort(unknown)
	var styled []string
	for k := range all {
		if !ourKey.MatchString(k) {
			styled = append(styled, k)
		}
	}
	slices.Sort(styled)
	for _, k := range styled {
		for _, name := range known {
			if folded(k) == folded(name) {
				return fmt.Errorf("context %s: no such setting: did you mean %s? (infra/README.md lists them)", k, name)
			}
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	k := unknown[0]
	// The key it most likely meant: one a letter or three away, or the
	// one that holds it (retentionMonths: partitionRetentionMonths).
	best, dist := "", math.MaxInt
	for _, name := range known {
		d := editDistance(strings.ToLower(k), strings.ToLower(name))
		if strings.Contains(strings.ToLower(name), strings.ToLower(k)) {
			d = min(d, 3)
		}
		if d < dist {
			best, dist = name, d
		}
	}
	if dist <= 3 {
		return fmt.Errorf("context %s: no such setting: did you mean %s? (infra/README.md lists them)", k, best)
	}
	return fmt.Errorf("context %s: no such setting (infra/README.md lists them)", k)
}

// folded is a key in lower case without '_' and '-'.
func folded(k string) string {
	return strings.ToLower(strings.NewReplacer("_", "", "-", "").Replace(k))
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}

// zeroMeans lists the numeric props whose zero means something (0 months of
// retention: keep forever). Every other numeric prop, set, must be positive:
// a 0 would only mean "the default", and a value set is never silently
// replaced by one. auroraMinCapacity=0 (Aurora's auto-pause) is refused
// with them: the schedules and RDS Proxy keep connections open, so the
// cluster would never pause, and were it paused, a lookup on a payment's
// path would wait for the resume (about 15 s), past its timeout.
var zeroMeans = map[string]bool{
	"partitionRetentionMonths": true, "sweepPause": true, "sweepPauseRatio": true, "sweepInFlightGrace": true, "partitionCompactPerRun": true,
}

func (c *contextReader) positive(name string, v float64) {
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0):
		c.fail(name, fmt.Errorf("must be a finite number, got %v", v))
	case v < 0 && zeroMeans[name]:
		c.fail(name, fmt.Errorf("must be 0 or positive, got %v", v))
	case v <= 0 && !zeroMeans[name]:
		c.fail(name, fmt.Errorf("must be positive, got %v (leave it unset for the default)", v))
	}
}

type contextReader struct {
	get func(*string) any
	err error
}

// raw is a value as text: a string as given (-c name=value, or a JSON
// string in cdk.json), a JSON number as written (1000000, not 1e+06), a
// JSON boolean. A list or an object is refused: printed, it would be
// deployed as its Go rendering.
func (c *contextReader) raw(name string) (string, bool) {
	switch v := c.get(jsii.String(name)).(type) {
	case nil:
		return "", false
	case string:
		return v, true
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64), true
	case bool:
		return strconv.FormatBool(v), true
	default:
		c.fail(name, fmt.Errorf("must be a string, a number or a boolean, got %T", v))
		return "", false
	}
}

// given reports whether the context sets name.
func (c *contextReader) given(name string) bool {
	_, ok := c.raw(name)
	return ok
}

func (c *contextReader) fail(name string, err error) {
	if c.err == nil {
		c.err = fmt.Errorf("context %s: %w", name, err)
	}
}

// str reads a string setting. An empty one is refused (-c name= would
// otherwise deploy the default), and so is one with blanks around it (the
// functions read their variables trimmed, the template would not).
func (c *contextReader) str(name, def string) string {
	v, ok := c.raw(name)
	switch {
	case !ok:
		return def
	case v == "":
		c.fail(name, errors.New("is set to an empty value: unset it for the default, or give it one"))
	case strings.TrimSpace(v) != v:
		c.fail(name, fmt.Errorf("%q has blanks around it", v))
	}
	return v
}

func (c *contextReader) int(name string) int {
	v, ok := c.raw(name)
	if !ok {
		return 0
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		c.fail(name, err)
	}
	c.positive(name, float64(n))
	return n
}

func (c *contextReader) float(name string) float64 {
	v, ok := c.raw(name)
	if !ok {
		return 0
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		c.fail(name, err)
	}
	c.positive(name, f)
	return f
}

func (c *contextReader) bool(name string) bool {
	b := c.boolPtr(name)
	return b != nil && *b
}

func (c *contextReader) boolPtr(name string) *bool {
	v, ok := c.raw(name)
	if !ok {
		return nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		c.fail(name, err)
	}
	return &b
}

func (c *contextReader) duration(name string) time.Duration {
	v, ok := c.raw(name)
	if !ok {
		return 0
	}
	// As the functions read their variables: a nonzero value too small to
	// be a duration ("0.1ns") is refused, never read as 0.
	d, err := settings.ParseDuration(v)
	if err != nil {
		c.fail(name, err)
	}
	c.positive(name, float64(d))
	return d
}

// durationPtr is duration for a value whose zero means something: nil when
// unset.
func (c *contextReader) durationPtr(name string) *time.Duration {
	if _, ok := c.raw(name); !ok {
		return nil
	}
	d := c.duration(name)
	return &d
}

// ratioPtr reads a ratio as the functions read their variables
// (settings.ParseRatio), for a value whose zero means something: nil when
// unset. Its range is the functions' settings' to check at synth.
func (c *contextReader) ratioPtr(name string) *float64 {
	v, ok := c.raw(name)
	if !ok {
		return nil
	}
	f, err := settings.ParseRatio(v)
	if err != nil {
		c.fail(name, err)
	}
	c.positive(name, f)
	return &f
}

// intPtr is int for a value whose zero means something: nil when unset.
func (c *contextReader) intPtr(name string) *int {
	if _, ok := c.raw(name); !ok {
		return nil
	}
	n := c.int(name)
	return &n
}
