package main

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/keytime"
)

func TestPercentile(t *testing.T) {
	t.Parallel()
	ds := []time.Duration{5, 1, 4, 2, 3, 10, 9, 8, 7, 6}
	for _, c := range []struct {
		p    float64
		want time.Duration
	}{{50, 5}, {95, 10}, {99, 10}, {100, 10}, {10, 1}, {11, 2}, {1, 1}} {
		require.Equal(t, c.want, percentile(ds, c.p), "p%v", c.p)
	}
	require.Equal(t, []time.Duration{5, 1, 4, 2, 3, 10, 9, 8, 7, 6}, ds, "the samples are not reordered")
	require.Zero(t, percentile(nil, 50))
	require.Equal(t, time.Duration(7), median([]time.Duration{7}))
}

func TestParseInitTrace(t *testing.T) {
	t.Parallel()
	out := `START RequestId: 1 Version: $LATEST
init internal/bytealg @0.008 ms, 0 ms clock, 0 bytes, 0 allocs
init runtime @0.031 ms, 0.040 ms clock, 0 bytes, 0 allocs
  init github.com/aws/aws-sdk-go-v2/service/lambda @3.1 ms, 0.25 ms clock, 1200 bytes, 10 allocs
init github.com/aws/aws-sdk-go-v2/aws @2.5 ms, 0.5 ms clock, 800 bytes, 5 allocs
init github.com/idemarchive/idemarchive/shared/archive @4.0 ms, 0.1 ms clock, 64 bytes, 1 allocs
init broken @x ms, 0.1 ms clock, 1 bytes, 1 allocs
{"level":"INFO","msg":"init github.com/x @1 ms"}`
	lines := parseInitTrace(out)
	require.Len(t, lines, 5)
	require.Equal(t, initLine{Package: "runtime", AtMS: 0.031, ClockMS: 0.040}, lines[1])

	s := summarizeInit(lines, 2)
	require.Equal(t, 5, s.Packages)
	require.InDelta(t, 0.89, s.ClockMS, 1e-9)
	require.InDelta(t, 4.1, s.DoneAtMS, 1e-9)
	require.EqualValues(t, 2064, s.Bytes)
	require.Equal(t, []initGroup{
		{Group: "github.com/aws/aws-sdk-go-v2", ClockMS: 0.75, Bytes: 2000},
		{Group: "shared/archive", ClockMS: 0.1, Bytes: 64},
	}, s.Top)
}

func TestFunctionInitSkipsTheEmulator(t *testing.T) {
	t.Parallel()
	out := `init runtime @0.02 ms, 0.03 ms clock, 0 bytes, 0 allocs
init github.com/aws/aws-lambda-runtime-interface-emulator/internal/rapi @1.5 ms, 0.2 ms clock, 10 bytes, 1 allocs
START RequestId: 1
init runtime @0.01 ms, 0.02 ms clock, 0 bytes, 0 allocs
init github.com/jackc/pgx/v5 @2.0 ms, 0.4 ms clock, 20 bytes, 2 allocs`
	run, ok := functionInit(parseInitTrace(out))
	require.True(t, ok)
	require.Len(t, run, 2)
	require.Equal(t, "github.com/jackc/pgx/v5", run[1].Package)
	_, ok = functionInit(parseInitTrace("init github.com/aws/aws-lambda-runtime-interface-emulator @0.1 ms, 0.1 ms clock, 0 bytes, 0 allocs"))
	require.False(t, ok)
}

func TestDependency(t *testing.T) {
	t.Parallel()
	for pkg, want := range map[string]string{
		"runtime":                              "std",
		"crypto/tls":                           "std",
		"github.com/jackc/pgx/v5/pgtype":       "github.com/jackc/pgx",
		"golang.org/x/net/http2":               "golang.org/x/net",
		"google.golang.org/grpc/internal":      "google.golang.org/grpc",
		module + "/shared/tracing":             "shared/tracing",
		"github.com/aws/aws-xray-sdk-go/v2/xr": "github.com/aws/aws-xray-sdk-go",
	} {
		require.Equal(t, want, dependency(pkg), pkg)
	}
}

func TestSizesFromEnv(t *testing.T) {
	t.Parallel()
	env := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }
	s, err := sizesFromEnv(env(nil))
	require.NoError(t, err)
	require.Equal(t, 1_000_000, s.LiveRows, "the issue asks for at least 1,000,000 live rows")
	require.Equal(t, []int{24, 120}, s.Months)
	require.Equal(t, 500_000, s.UnexpiredRows)
	require.Equal(t, 300_000, s.TrafficBacklog)
	require.Equal(t, 500_000, s.CompactRows)

	s, err = sizesFromEnv(env(map[string]string{"BENCH_LIVE_ROWS": "5_000_000", "BENCH_MONTHS": "12, 36"}))
	require.NoError(t, err)
	require.Equal(t, 5_000_000, s.LiveRows)
	require.Equal(t, []int{12, 36}, s.Months)

	// A size past what a run can hold is refused by name, not a panic
	// (makeslice) or a count that overflowed ("copied 0 of -2").
	s, err = sizesFromEnv(env(map[string]string{"BENCH_LIVE_ROWS": "100_000_000", "BENCH_UNEXPIRED_ROWS": "100000000"}))
	require.NoError(t, err)
	require.Equal(t, 200_000_000, s.LiveRows+s.UnexpiredRows)
	for k, v := range map[string]string{"BENCH_LIVE_ROWS": "0", "BENCH_LOOKUPS": "many", "BENCH_MONTHS": "120,24", "BENCH_COLD_STARTS": "-1", "BENCH_COMPACT_ROWS": "0",
		"BENCH_TRAFFIC_OPS": "9223372036854775807", "BENCH_UNEXPIRED_ROWS": "100_000_001", "BENCH_ROWS_PER_MONTH": "1e9"} {
		_, err := sizesFromEnv(env(map[string]string{k: v}))
		require.ErrorContains(t, err, k)
	}
}

// The bench's keys must be the shapes they claim: the archive's pruning and
// the store's skip read timestamps only from canonical ULIDs and UUIDv7s.
func TestKeyShapes(t *testing.T) {
	t.Parallel()
	g := newKeyGen(7)
	minted := time.Date(2026, 3, 4, 5, 6, 7, 8e6, time.UTC)
	for range 100 {
		for _, shape := range []int{shapeULID, shapeUUIDv7} {
			ts, ok := keytime.FromKey(g.key(shape, minted))
			require.True(t, ok)
			require.Equal(t, minted, ts)
		}
		_, ok := keytime.FromKey(g.key(shapePlain, minted))
		require.False(t, ok, "plain keys carry no timestamp")
		_, ok = keytime.FromKey(scopePrefix + g.uuidV4())
		require.False(t, ok, "UUIDv4 keys carry no timestamp")
	}
	require.Len(t, g.key(shapePlain, minted), 40)
}

func TestRelationsInPlan(t *testing.T) {
	t.Parallel()
	plan := `[{"Plan": {"Node Type": "Append", "Plans": [
		{"Node Type": "Index Scan", "Relation Name": "idempotency_key_archive_2026_01"},
		{"Node Type": "Index Scan", "Relation Name": "idempotency_key_archive_2026_02"},
		{"Node Type": "Index Scan", "Relation Name": "idempotency_key_archive_2026_02"}]}}]`
	n, err := relationsInPlan([]byte(plan))
	require.NoError(t, err)
	require.Equal(t, 2, n)
}

func TestThousands(t *testing.T) {
	t.Parallel()
	for n, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", 1234567: "1,234,567", -45000: "-45,000"} {
		require.Equal(t, want, thousands(n))
	}
}

func TestParentIndexLocksNamesTheServerWhereItApplies(t *testing.T) {
	for version, want := range map[string]bool{
		"PostgreSQL 15.18 (Debian 15.18-0+deb12u1) on x86_64-pc-linux-gnu": false,
		"PostgreSQL 17.10 on x86_64-pc-linux-gnu":                          true,
		"PostgreSQL 18.1 on aarch64-unknown-linux-gnu":                     true,
		"":                         false,
		"EnterpriseDB 17 whatever": false,
	} {
		got := parentIndexLocks(version)
		if (got != "") != want {
			t.Errorf("parentIndexLocks(%q) = %q", version, got)
		}
	}
	if got := parentIndexLocks("PostgreSQL 17.10 on x86_64-pc-linux-gnu"); !strings.Contains(got, "PostgreSQL 17,") {
		t.Errorf("got %q", got)
	}
}
