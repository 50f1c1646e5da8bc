package main

import (
	"fmt"
	"math"
	"os"
	"strconv"
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
	}
	// The CLI sets these from the credentials in use; make synth leaves the
	// stack environment-agnostic.
	if acct, region := os.Getenv("CDK_DEFAULT_ACCOUNT"), os.Getenv("CDK_DEFAULT_REGION"); acct != "" && region != "" {
		p.Env = &awscdk.Environment{Account: jsii.String(acct), Region: jsii.String(region)}
	}
	return p, c.str("stackName", DefaultStackName), c.err
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

func (c *contextReader) raw(name string) (string, bool) {
	v := c.get(jsii.String(name))
	if v == nil {
		return "", false
	}
	return fmt.Sprint(v), true
}

func (c *contextReader) fail(name string, err error) {
	if c.err == nil {
		c.err = fmt.Errorf("context %s: %w", name, err)
	}
}

func (c *contextReader) str(name, def string) string {
	if v, ok := c.raw(name); ok {
		return v
	}
	return def
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
