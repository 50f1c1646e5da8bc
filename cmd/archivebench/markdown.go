package main

import (
	"fmt"
	"strings"
)

// tables renders the figures as markdown tables.
func (r *report) tables() string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	if s := r.Sweep; s != nil {
		w("### 1. Sweep: %s expired live rows beside %s unexpired, batch %s\n\n", thousands(int64(s.LiveRows)), thousands(int64(s.Unexpired)), thousands(int64(s.BatchSize)))
		w("| Contender | rows/s | vs runbook | vs unbatched | batches | batch p50 ms | p95 ms | max ms | WAL B/row | left live |\n")
		w("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
		for _, c := range s.Contenders {
			w("| %s | %s | %.2fx | %.2fx | %d | %.1f | %.1f | %.1f | %.0f | %d |\n",
				c.Contender, thousands(int64(c.RowsPerSec)), c.VsRunbook, c.VsUnbatched, c.Batches, c.BatchP50MS, c.BatchP95MS, c.BatchMaxMS, c.WALPerRow, c.LeftLive)
		}
		w("\nThe live table also holds %s rows not yet expired, which every contender left in place. Keys average %.1f bytes. Each contender moves the same rows, reloaded fresh into the live table.\n\n", thousands(int64(s.Unexpired)), s.AvgKeyBytes)
		w("### 3. Storage: the archive after each sweep (runbook's model: %d B/row)\n\n", runbookModelBytes)
		w("| After | rows | heap B/row | indexes B/row | of which primary key | total B/row | vs 110 B | row-layout floor B/row |\n")
		w("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
		for _, c := range s.Contenders {
			st := c.Storage
			w("| %s | %s | %.0f | %.0f | %.0f | %.0f | %.2fx | %.0f |\n",
				c.Contender, thousands(st.Rows), st.HeapPerRow, st.IndexPerRow, st.PKPerRow, st.TotalPerRow, st.VsRunbook110, st.FloorPerRow)
		}
		w("\n")
	}
	if l := r.Lookup; l != nil {
		w("### 2. Archive lookup: %s rows per monthly partition, %s lookups per case\n\n", thousands(int64(l.RowsPerMonth)), thousands(int64(l.Lookups)))
		w("| Partitions (months with data) | Keys | archive.Reader p50 / p99 ms | naive p50 / p99 ms | p50 vs naive | p99 vs naive | relation locks (Reader / naive) | partitions read (Reader / naive) |\n")
		w("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n")
		for _, set := range l.Sets {
			for _, c := range set.Results {
				w("| %d (%d) | %s | %.2f / %.2f | %.2f / %.2f | %.2fx | %.2fx | %.1f / %.1f | %.1f / %.1f |\n",
					set.Partitions, set.MonthsWithData, c.Case, c.ReaderP50MS, c.ReaderP99MS, c.NaiveP50MS, c.NaiveP99MS,
					c.P50VsNaive, c.P99VsNaive, c.ReaderLocks, c.NaiveLocks, c.ReaderParts, c.NaiveParts)
			}
		}
		w("\n")
	}
	if f := r.Fresh; f != nil {
		w("### 4. Archive lookups on the fresh-key path (middleware, Postgres live store)\n\n")
		w("| Keys | requests | archive lookups | per 1,000 requests | request p50 / p99 ms | p50 vs UUIDv7 |\n")
		w("| --- | ---: | ---: | ---: | ---: | ---: |\n")
		for _, c := range f.Results {
			w("| %s | %s | %d | %.0f | %.2f / %.2f | %.2fx |\n", c.Keys, thousands(int64(c.Requests)), c.Lookups, c.LookupsPer1000, c.RequestP50MS, c.RequestP99MS, c.P50VsTimestamps)
		}
		w("\n")
	}
	if fn := r.Functions; fn != nil {
		w("### 5. Functions: package size (linux/arm64) and cold start under the emulator (this machine)\n\n")
		w("| Function | bootstrap MB | zip MB | zip vs baseline | cold start median / max ms | vs baseline | warm invoke ms | Go init ms (packages) | init vs baseline |\n")
		w("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
		for _, c := range fn.Functions {
			w("| %s | %.1f | %.1f | %.1fx | %.0f / %.0f | %.2fx | %.1f | %.1f (%d) | %.1fx |\n",
				c.Function, mb(c.BootstrapBytes), mb(c.ZipBytes), c.ZipVsBaseline, c.ColdStartMS, c.ColdStartMaxMS, c.ColdVsBaseline,
				c.WarmInvokeMS, c.Init.ClockMS, c.Init.Packages, c.InitVsBaseline)
		}
		w("\nWhat each dependency's package init costs (median run with GODEBUG=inittrace=1, top groups):\n\n")
		w("| Function | dependency: init ms |\n| --- | --- |\n")
		for _, c := range fn.Functions {
			var parts []string
			for _, g := range c.Init.Top {
				parts = append(parts, fmt.Sprintf("%s %.2f", g.Group, g.ClockMS))
			}
			w("| %s | %s |\n", c.Function, strings.Join(parts, "; "))
		}
		w("\n")
	}
	return b.String()
}

func mb(n int64) float64 { return float64(n) / (1 << 20) }

// thousands formats n with comma separators: 1000000 is 1,000,000.
func thousands(n int64) string {
	neg := n < 0
	if neg {
		n = -n
	}
	s := fmt.Sprint(n)
	var out []byte
	for i, c := range []byte(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, c)
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}

// document is BENCHMARKS.md: how it was made, the tables, the capacity model.
func (r *report) document(tables string) string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("# Benchmarks\n\n")
	w("Written by `%s` on %s.\n\n", r.Command, r.Date)
	w("%s\n", tables)
	return b.String()
}
