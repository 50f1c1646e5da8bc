package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/infra/stack"
)

func contextOf(values map[string]any) func(*string) any {
	return func(k *string) any { return values[*k] }
}

func TestPropsFromContext(t *testing.T) {
	// GIVEN context values as -c gives them (strings) and as cdk.json gives
	// them (JSON numbers and booleans)
	p, name, err := propsFromContext(contextOf(map[string]any{
		"stackName":           "Archive-Prod",
		"codeDir":             "/tmp/zips",
		"sweepInterval":       "10m",
		"sweepBatchSize":      float64(5000),
		"partitionLeadMonths": "4",
		"alarmEmail":          "oncall@example.com",
		"deletionProtection":  false,
		"aurora":              "true",
		"auroraMaxCapacity":   8.5,
		"liveTtl":             "48h",
	}))
	// THEN each lands in its prop
	require.NoError(t, err)
	require.Equal(t, "Archive-Prod", name)
	require.Equal(t, stack.Props{
		CodeDir: "/tmp/zips", SweepInterval: 10 * time.Minute, SweepBatchSize: 5000, PartitionLeadMonths: 4,
		AlarmEmail: "oncall@example.com", DeletionProtection: new(false), Aurora: true, AuroraMaxCapacity: 8.5,
		LiveTTL: 48 * time.Hour, StackProps: p.StackProps,
	}, p)

	// AND without context, the defaults: bin/ beside infra/, the default name
	p, name, err = propsFromContext(contextOf(nil))
	require.NoError(t, err)
	require.Equal(t, DefaultStackName, name)
	require.Equal(t, "../bin", p.CodeDir)
	require.Nil(t, p.DeletionProtection, "unset, so the stack's default (true) applies")

	// AND a value that does not parse is an error naming it
	_, _, err = propsFromContext(contextOf(map[string]any{"sweepInterval": "5 minutes"}))
	require.ErrorContains(t, err, "context sweepInterval")
	_, _, err = propsFromContext(contextOf(map[string]any{"deletionProtection": "maybe"}))
	require.ErrorContains(t, err, "context deletionProtection")

	// AND a zero that could only mean "the default" is refused, never
	// silently replaced; a zero that means something is kept
	for name, v := range map[string]any{"liveTtl": "0s", "sweepBatchSize": float64(0), "partitionLeadMonths": "0", "sweepInterval": "-5m", "auroraMinCapacity": "0"} {
		_, _, err = propsFromContext(contextOf(map[string]any{name: v}))
		require.ErrorContains(t, err, "context "+name+": must be positive", name)
	}
	p, _, err = propsFromContext(contextOf(map[string]any{"partitionRetentionMonths": "0"}))
	require.NoError(t, err)
	require.Zero(t, p.PartitionRetentionMonths)
	for _, name := range []string{"sweepStatementTimeout", "sweepLockTimeout", "sweepDeadlineMargin", "partitionStatementTimeout", "partitionLockTimeout"} {
		_, _, err = propsFromContext(contextOf(map[string]any{name: "0s"}))
		require.ErrorContains(t, err, "context "+name+": must be positive", name)
	}

	// AND the function settings whose zero means something (no fixed pause, no ratio, no
	// grace, no compaction) keep a zero, from -c and from cdk.json alike,
	// and stay nil when unset
	p, _, err = propsFromContext(contextOf(map[string]any{"sweepPause": "0s", "sweepPauseRatio": float64(0), "sweepInFlightGrace": float64(0), "partitionCompactPerRun": float64(0)}))
	require.NoError(t, err)
	require.Equal(t, new(time.Duration(0)), p.SweepPause)
	require.Equal(t, new(0.0), p.SweepPauseRatio)
	require.Equal(t, new(time.Duration(0)), p.SweepInFlightGrace)
	require.Equal(t, new(0), p.PartitionCompactPerRun)
	p, _, err = propsFromContext(contextOf(map[string]any{
		"sweepPause": "1s", "sweepStatementTimeout": "45s", "sweepLockTimeout": "3s", "sweepDeadlineMargin": "50s",
		"sweepResourceIdPath": "data.id", "partitionStatementTimeout": "4m", "partitionLockTimeout": "10s", "partitionCompactPerRun": "2",
	}))
	require.NoError(t, err)
	require.Equal(t, new(time.Second), p.SweepPause)
	require.Nil(t, p.SweepPauseRatio)
	require.Nil(t, p.SweepInFlightGrace)
	require.Equal(t, []any{45 * time.Second, 3 * time.Second, 50 * time.Second, "data.id", 4 * time.Minute, 10 * time.Second, new(2)},
		[]any{p.SweepStatementTimeout, p.SweepLockTimeout, p.SweepDeadlineMargin, p.SweepResourceIDPath, p.PartitionStatementTimeout, p.PartitionLockTimeout, p.PartitionCompactPerRun})
	for raw, want := range map[any]float64{"1.5": 1.5, float64(7): 7, "99": 99} {
		p, _, err = propsFromContext(contextOf(map[string]any{"sweepPauseRatio": raw}))
		require.NoError(t, err, raw)
		require.Equal(t, new(want), p.SweepPauseRatio, raw)
	}
	for _, name := range []string{"sweepPause", "sweepPauseRatio", "sweepInFlightGrace", "partitionCompactPerRun", "partitionRetentionMonths"} {
		_, _, err = propsFromContext(contextOf(map[string]any{name: "-1"}))
		require.ErrorContains(t, err, "context "+name, name)
	}
	_, _, err = propsFromContext(contextOf(map[string]any{"sweepPause": "-1s"}))
	require.ErrorContains(t, err, "context sweepPause: must be 0 or positive")
	_, _, err = propsFromContext(contextOf(map[string]any{"sweepPauseRatio": "NaN"}))
	require.ErrorContains(t, err, "context sweepPauseRatio: not a decimal number")
	_, _, err = propsFromContext(contextOf(map[string]any{"sweepPauseRatio": "1_0"}))
	require.ErrorContains(t, err, "context sweepPauseRatio: not a decimal number")
	_, _, err = propsFromContext(contextOf(map[string]any{"sweepPauseRatio": "a lot"}))
	require.ErrorContains(t, err, "context sweepPauseRatio")
	_, _, err = propsFromContext(contextOf(map[string]any{"partitionCompactPerRun": "one"}))
	require.ErrorContains(t, err, "context partitionCompactPerRun")

	// AND the lookup's concurrency: a reservation of 0 is refused (it
	// would throttle every lookup), as is an explicit 0 provisioned
	p, _, err = propsFromContext(contextOf(map[string]any{"lookupReservedConcurrency": "10", "lookupProvisionedConcurrency": float64(4)}))
	require.NoError(t, err)
	require.Equal(t, new(10), p.LookupReservedConcurrency)
	require.Equal(t, 4, p.LookupProvisionedConcurrency)
	for _, name := range []string{"lookupReservedConcurrency", "lookupProvisionedConcurrency"} {
		_, _, err = propsFromContext(contextOf(map[string]any{name: "0"}))
		require.ErrorContains(t, err, "context "+name+": must be positive", name)
	}

	// AND a number that is not finite is refused, naming it (a NaN
	// baseline made the synth panic in jsii)
	for name, v := range map[string]any{"archiveBytesPerRowBaseline": "NaN", "apiRateLimit": "Inf", "auroraMaxCapacity": "-Inf", "apiBurstLimit": "nan"} {
		_, _, err = propsFromContext(contextOf(map[string]any{name: v}))
		require.ErrorContains(t, err, "context "+name+": must be a finite number", name)
	}
}

func TestSynthWritesTheTemplateSAMCanInvoke(t *testing.T) {
	// GIVEN placeholder packages, an output directory and context values
	code := placeholderZips(t)
	out := t.TempDir()

	// WHEN the app runs
	require.NoError(t, run(out, map[string]any{"codeDir": code, "stackName": "SynthTest"}))

	// THEN the template is there, and every function of ours names its
	// staged code for sam local invoke
	raw, err := os.ReadFile(filepath.Join(out, "SynthTest.template.json"))
	require.NoError(t, err)
	var tpl struct {
		Resources map[string]struct {
			Type       string
			Properties map[string]any
			Metadata   map[string]any
		}
	}
	require.NoError(t, json.Unmarshal(raw, &tpl))
	ours := 0
	for id, r := range tpl.Resources {
		if r.Type != "AWS::Lambda::Function" || r.Properties["Runtime"] != "provided.al2023" {
			continue
		}
		ours++
		path, _ := r.Metadata["aws:asset:path"].(string)
		require.NotEmpty(t, path, id)
		require.Equal(t, "Code", r.Metadata["aws:asset:property"], id)
		_, err := os.Stat(filepath.Join(out, path))
		require.NoError(t, err, "%s: staged asset", id)
	}
	require.Equal(t, len(stack.FunctionNames), ours)
}

// A context key shaped like the stack's own that is none of them is a
// mistake: the synth fails naming it and the key it most likely meant,
// instead of deploying the default without a word. The CDK's own keys (and
// its lookups', and other tools') are left alone.
func TestAMisspeltContextKeyFailsTheSynth(t *testing.T) {
	code := placeholderZips(t)
	for key, want := range map[string]string{
		"alarmEmial":         "context alarmEmial: no such setting: did you mean alarmEmail?",
		"deletionprotection": "context deletionprotection: no such setting: did you mean deletionProtection?",
		"retentionMonths":    "context retentionMonths: no such setting: did you mean partitionRetentionMonths?",
		"frobnicate":         "context frobnicate: no such setting (infra/README.md lists them)",
	} {
		err := run(t.TempDir(), map[string]any{"codeDir": code, key: "x"})
		require.ErrorContains(t, err, want, key)
	}
	require.NoError(t, run(t.TempDir(), map[string]any{
		"codeDir": code,
		"@aws-cdk/aws-lambda:recognizeLayerVersion":                true,
		"availability-zones:account=123456789012:region=eu-west-1": []any{"eu-west-1a"},
		"acknowledged-issue-numbers":                               []any{34892},
	}))
}
