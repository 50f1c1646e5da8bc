package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/testenv"
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

	// Under make bench TRACING=off the lookup links no X-Ray: the two are
	// one build measured twice, and no cost is claimed.
	yes, no := true, false
	lookup.LinksXRay, untraced.LinksXRay = &no, &no
	r = report{Functions: &functionsSection{Functions: []functionResult{lookup, untraced}}}
	require.NotContains(t, r.tables(), "What the X-Ray SDK costs")
	require.Contains(t, r.tables(), "The lookup of this run links no X-Ray SDK (`make bench TRACING=off`)")
	lookup.LinksXRay = &yes
	r = report{Functions: &functionsSection{Functions: []functionResult{lookup, untraced}}}
	require.Contains(t, r.tables(), "What the X-Ray SDK costs")
}

// Whether a build links the X-Ray SDK is read from its build information.
func TestLinksXRay(t *testing.T) {
	t.Parallel()
	traced, err := linksXRay(testenv.Bootstraps(t, "lookup")["lookup"])
	require.NoError(t, err)
	require.True(t, traced, "the lookup as deployed")
	untraced, err := linksXRay(os.Args[0])
	require.NoError(t, err)
	require.False(t, untraced, "this test, which links no X-Ray")
	_, err = linksXRay(filepath.Join(t.TempDir(), "missing"))
	require.ErrorContains(t, err, "read the build information")
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
