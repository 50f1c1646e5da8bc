package main

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// percentile returns the nearest-rank p-th percentile (0 < p <= 100) of ds,
// or 0 for no samples. ds is not modified.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := int(float64(len(s))*p/100 + 0.999999999)
	rank = min(max(rank, 1), len(s))
	return s[rank-1]
}

// median is the 50th percentile.
func median(ds []time.Duration) time.Duration { return percentile(ds, 50) }

// ms is a duration in milliseconds, for the report.
func ms(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }

// ratio is a/b, or 0 when b is 0.
func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// initLine is one line of GODEBUG=inittrace=1 output:
//
//	init github.com/jackc/pgx/v5/pgtype @2.1 ms, 0.31 ms clock, 77880 bytes, 642 allocs
type initLine struct {
	Package string  `json:"package"`
	AtMS    float64 `json:"at_ms"`
	ClockMS float64 `json:"clock_ms"`
	Bytes   int64   `json:"bytes"`
	Allocs  int64   `json:"allocs"`
}

var initRE = regexp.MustCompile(`^init (\S+) @([0-9.]+) ms, ([0-9.]+) ms clock, ([0-9]+) bytes, ([0-9]+) allocs`)

// parseInitTrace returns the inittrace lines in out, in order. Other lines
// (the emulator's, the function's logs) are skipped.
func parseInitTrace(out string) []initLine {
	var lines []initLine
	for _, l := range strings.Split(out, "\n") {
		m := initRE.FindStringSubmatch(strings.TrimSpace(l))
		if m == nil {
			continue
		}
		at, err1 := strconv.ParseFloat(m[2], 64)
		clock, err2 := strconv.ParseFloat(m[3], 64)
		b, err3 := strconv.ParseInt(m[4], 10, 64)
		a, err4 := strconv.ParseInt(m[5], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil || err4 != nil {
			continue
		}
		lines = append(lines, initLine{Package: m[1], AtMS: at, ClockMS: clock, Bytes: b, Allocs: a})
	}
	return lines
}

// splitInitRuns splits inittrace lines into one run per process: each
// process's lines start near @0 ms and only grow, so a line earlier than
// the one before it begins the next process. Under the emulator, the
// emulator (which inherits GODEBUG) initialises first, then the function.
func splitInitRuns(lines []initLine) [][]initLine {
	var runs [][]initLine
	for i, l := range lines {
		if i == 0 || l.AtMS < lines[i-1].AtMS {
			runs = append(runs, nil)
		}
		runs[len(runs)-1] = append(runs[len(runs)-1], l)
	}
	return runs
}

// functionInit returns the run of the process that is not the emulator's
// (which initialises packages of emulatorModule), or false.
func functionInit(lines []initLine) ([]initLine, bool) {
	for _, run := range splitInitRuns(lines) {
		emulator := false
		for _, l := range run {
			if strings.HasPrefix(l.Package, emulatorModule) {
				emulator = true
				break
			}
		}
		if !emulator {
			return run, true
		}
	}
	return nil, false
}

const emulatorModule = "github.com/aws/aws-lambda-runtime-interface-emulator"

// initSummary is what a function's package initialisation cost.
type initSummary struct {
	Packages int     `json:"packages"`
	ClockMS  float64 `json:"clock_ms"` // sum of every package's init clock time
	DoneAtMS float64 `json:"done_at_ms"`
	Bytes    int64   `json:"bytes"`
	// Top are the dependencies (module-level groups) whose inits cost most.
	Top []initGroup `json:"top"`
}

type initGroup struct {
	Group   string  `json:"group"`
	ClockMS float64 `json:"clock_ms"`
	Bytes   int64   `json:"bytes"`
}

// summarizeInit sums lines and groups them by dependency, keeping the n
// costliest groups.
func summarizeInit(lines []initLine, n int) initSummary {
	s := initSummary{Packages: len(lines)}
	groups := map[string]*initGroup{}
	for _, l := range lines {
		s.ClockMS += l.ClockMS
		s.Bytes += l.Bytes
		s.DoneAtMS = max(s.DoneAtMS, l.AtMS+l.ClockMS)
		g := dependency(l.Package)
		if groups[g] == nil {
			groups[g] = &initGroup{Group: g}
		}
		groups[g].ClockMS += l.ClockMS
		groups[g].Bytes += l.Bytes
	}
	for _, g := range groups {
		s.Top = append(s.Top, *g)
	}
	slices.SortFunc(s.Top, func(a, b initGroup) int {
		if a.ClockMS != b.ClockMS {
			if a.ClockMS > b.ClockMS {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Group, b.Group)
	})
	if len(s.Top) > n {
		s.Top = s.Top[:n]
	}
	return s
}

// dependency names the module-level group of a package path: "std" for the
// standard library, the repository for github.com and golang.org/x paths
// (github.com/aws/aws-sdk-go-v2/service/lambda is github.com/aws/aws-sdk-go-v2),
// and this module's own packages by their directory.
func dependency(pkg string) string {
	parts := strings.Split(pkg, "/")
	first := parts[0]
	if !strings.Contains(first, ".") {
		return "std"
	}
	if strings.HasPrefix(pkg, module+"/") && len(parts) >= 5 {
		return strings.Join(parts[3:5], "/")
	}
	switch first {
	case "github.com", "golang.org", "google.golang.org", "go.uber.org", "gopkg.in", "dario.cat":
		if first == "golang.org" && len(parts) >= 3 {
			return strings.Join(parts[:3], "/")
		}
		if len(parts) >= 3 && first == "github.com" {
			return strings.Join(parts[:3], "/")
		}
		if len(parts) >= 2 {
			return strings.Join(parts[:2], "/")
		}
	}
	return pkg
}

const module = "github.com/idemarchive/idemarchive"

// parseSizes reads a comma-separated list of positive integers, such as
// BENCH_MONTHS=24,120.
func parseSizes(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive whole number", strings.TrimSpace(f))
		}
		out = append(out, n)
	}
	return out, nil
}
