package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The functions table names what the X-Ray SDK costs the lookup when the run
// measured the lookup with and without it, and says nothing of it otherwise.
func TestXRayCostRendering(t *testing.T) {
	t.Parallel()
	lookup := functionResult{Function: "lookup", BootstrapBytes: 16 << 20, ZipBytes: 6 << 20, ColdStartMS: 110, Init: initSummary{ClockMS: 12}}
	untraced := functionResult{Function: lookupWithoutXRay, BootstrapBytes: 10 << 20, ZipBytes: 4 << 20, ColdStartMS: 100, Init: initSummary{ClockMS: 8}}
	r := report{Functions: &functionsSection{Functions: []functionResult{lookup, untraced}}}
	require.Contains(t, r.tables(), "bootstrap 16.0 MB against 10.0 MB (38% of it), zip 6.0 MB against 4.0 MB, cold start 110 ms against 100 ms (1.10x), Go init 12.0 ms against 8.0 ms.")
	r = report{Functions: &functionsSection{Functions: []functionResult{lookup}}}
	require.NotContains(t, r.tables(), "What the X-Ray SDK costs")
}

// The bench measures the lookup built without the X-Ray SDK, from the
// builds make bench-baseline writes, beside the lookup as deployed.
func TestProjectFunctionsIncludeTheLookupWithoutXRay(t *testing.T) {
	t.Parallel()
	fns := projectFunctions("bin", "events")
	var names []string
	for _, f := range fns {
		names = append(names, f.name)
	}
	require.Equal(t, []string{baselineFunction, "lookup", lookupWithoutXRay, "sweep", "partitions", "migrate"}, names)
	require.Equal(t, functionPaths{
		name:      lookupWithoutXRay,
		bootstrap: "bin/bench/lookup-notrace/bootstrap",
		zip:       "bin/bench/lookup-notrace.zip",
		local:     "bin/bench/local/lookup-notrace/bootstrap",
		event:     "events/lookup-direct.json",
	}, fns[2])
}
