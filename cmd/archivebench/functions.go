package main

import (
	"context"
	"debug/buildinfo"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"time"

	"github.com/idemarchive/idemarchive/shared/emulator"
)

// baselineFunction is the cold-start and size baseline: cmd/archivebench/nullfn.
const baselineFunction = "baseline (aws-lambda-go only)"

// lookupWithoutXRay is the lookup function built without the X-Ray SDK
// (make build TRACING=off).
const lookupWithoutXRay = "lookup without X-Ray (TRACING=off)"

// functionResult is one function's package size and cold start.
type functionResult struct {
	Function       string  `json:"function"`
	BootstrapBytes int64   `json:"bootstrap_bytes"`
	ZipBytes       int64   `json:"zip_bytes"`
	ColdStarts     int     `json:"cold_starts"`
	ColdStartMS    float64 `json:"cold_start_median_ms"` // emulator start to first answer
	ColdStartMaxMS float64 `json:"cold_start_max_ms"`
	WarmInvokeMS   float64 `json:"warm_invoke_median_ms"`
	// Init is the Go package initialisation of the median inittrace run.
	Init             initSummary `json:"init"`
	ColdVsBaseline   float64     `json:"cold_start_vs_baseline"`
	ZipVsBaseline    float64     `json:"zip_vs_baseline"`
	InitVsBaseline   float64     `json:"init_vs_baseline"`
	FirstAnswerBytes int         `json:"first_answer_bytes"`
	// LinksXRay says whether the bootstrap links the X-Ray SDK, read from
	// its build information; nil in a run made before it was recorded.
	LinksXRay *bool `json:"links_xray,omitempty"`
}

// xrayModule is the X-Ray SDK's module, in a build's dependencies when it
// links the SDK (a notrace build does not).
const xrayModule = "github.com/aws/aws-xray-sdk-go/v2"

// linksXRay reports whether the binary at path links the X-Ray SDK.
func linksXRay(path string) (bool, error) {
	bi, err := buildinfo.ReadFile(path)
	if err != nil {
		return false, fmt.Errorf("read the build information of %s: %w", path, err)
	}
	return slices.ContainsFunc(bi.Deps, func(m *debug.Module) bool { return m.Path == xrayModule }), nil
}

type functionsSection struct {
	Functions []functionResult `json:"functions"`
}

// functionPaths says where the bench finds a function's builds.
type functionPaths struct {
	name, bootstrap, zip, local, event string
}

// projectFunctions lists the builds `make build` (arm64, for size) and
// `make build-local-<fn>` (this machine, for the emulator) write, and the
// sample event each is invoked with.
func projectFunctions(bin, events string) []functionPaths {
	fns := []functionPaths{{
		name:      baselineFunction,
		bootstrap: filepath.Join(bin, "bench", "nullfn", "bootstrap"),
		zip:       filepath.Join(bin, "bench", "nullfn.zip"),
		local:     filepath.Join(bin, "bench", "local", "nullfn", "bootstrap"),
	}}
	for _, f := range []struct{ name, event string }{
		{"lookup", "lookup-direct.json"},
		{"sweep", "sweep-schedule.json"},
		{"partitions", "partitions-dry-run.json"},
		{"migrate", "migrate-cfn-delete.json"},
	} {
		fns = append(fns, functionPaths{
			name:      f.name,
			bootstrap: filepath.Join(bin, f.name, "bootstrap"),
			zip:       filepath.Join(bin, f.name+".zip"),
			local:     filepath.Join(bin, "local", f.name, "bootstrap"),
			event:     filepath.Join(events, f.event),
		})
	}
	// What the X-Ray SDK costs the function on a payment's path: the same
	// lookup built with the notrace tag (make bench-baseline).
	return slices.Insert(fns, 2, functionPaths{
		name:      lookupWithoutXRay,
		bootstrap: filepath.Join(bin, "bench", "lookup-notrace", "bootstrap"),
		zip:       filepath.Join(bin, "bench", "lookup-notrace.zip"),
		local:     filepath.Join(bin, "bench", "local", "lookup-notrace", "bootstrap"),
		event:     filepath.Join(events, "lookup-direct.json"),
	})
}

// checkFunctionBuilds fails, before anything is measured, when a build the
// functions step needs is missing.
func checkFunctionBuilds(fns []functionPaths, rie string) error {
	need := []string{rie}
	for _, f := range fns {
		need = append(need, f.bootstrap, f.zip, f.local)
		if f.event != "" {
			need = append(need, f.event)
		}
	}
	for _, p := range need {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("%s is missing (make bench builds it: make build build-local, the emulator with make %s; or run with -only to skip functions)", p, rie)
		}
	}
	return nil
}

func benchFunctions(ctx context.Context, base, bin, events, rie string, starts int, p *progress) (functionsSection, error) {
	var sec functionsSection
	fns := projectFunctions(bin, events)
	if err := checkFunctionBuilds(fns, rie); err != nil {
		return sec, err
	}
	db, err := newBenchDB(ctx, base, "functions")
	if err != nil {
		return sec, err
	}
	defer db.Drop()
	if _, err := db.partitions(ctx); err != nil {
		return sec, err
	}
	// The migrate function answers CloudFormation at the event's ResponseURL.
	cfn := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
	}))
	defer cfn.Close()

	for _, f := range fns {
		res := functionResult{Function: f.name, ColdStarts: starts}
		if res.BootstrapBytes, err = fileSize(f.bootstrap); err != nil {
			return sec, err
		}
		if res.ZipBytes, err = fileSize(f.zip); err != nil {
			return sec, err
		}
		xray, err := linksXRay(f.bootstrap)
		if err != nil {
			return sec, err
		}
		res.LinksXRay = &xray
		payload := []byte(`{}`)
		if f.event != "" {
			if payload, err = eventPayload(f.event, cfn.URL); err != nil {
				return sec, err
			}
		}
		env := map[string]string{"DATABASE_URL": db.URL}
		var cold, warm []time.Duration
		var inits []initSummary
		for i := 0; i < starts; i++ {
			p.Step("functions: %s cold start %d of %d", f.name, i+1, starts)
			c, w, answer, _, err := coldStart(ctx, rie, f.local, env, payload)
			if err != nil {
				return sec, fmt.Errorf("%s: %w", f.name, err)
			}
			cold, warm = append(cold, c), append(warm, w)
			res.FirstAnswerBytes = len(answer)
		}
		traceEnv := map[string]string{"DATABASE_URL": db.URL, "GODEBUG": "inittrace=1"}
		for i := 0; i < starts; i++ {
			p.Step("functions: %s init trace %d of %d", f.name, i+1, starts)
			_, _, _, out, err := coldStart(ctx, rie, f.local, traceEnv, payload)
			if err != nil {
				return sec, fmt.Errorf("%s with inittrace: %w", f.name, err)
			}
			lines, ok := functionInit(parseInitTrace(out))
			if !ok {
				return sec, fmt.Errorf("%s printed no inittrace lines of its own with GODEBUG=inittrace=1", f.name)
			}
			inits = append(inits, summarizeInit(lines, 6))
		}
		res.ColdStartMS = ms(median(cold))
		res.ColdStartMaxMS = ms(percentile(cold, 100))
		res.WarmInvokeMS = ms(median(warm))
		res.Init = medianInit(inits)
		sec.Functions = append(sec.Functions, res)
	}
	if len(sec.Functions) > 0 {
		b := sec.Functions[0]
		for i := range sec.Functions {
			f := &sec.Functions[i]
			f.ColdVsBaseline = ratio(f.ColdStartMS, b.ColdStartMS)
			f.ZipVsBaseline = ratio(float64(f.ZipBytes), float64(b.ZipBytes))
			f.InitVsBaseline = ratio(f.Init.ClockMS, b.Init.ClockMS)
		}
	}
	return sec, nil
}

// coldStart starts the emulator with bootstrap, invokes it once (the cold
// start: emulator start to first answer) and once more (warm), stops it,
// and returns both times, the first answer and everything it printed.
func coldStart(ctx context.Context, rie, bootstrap string, env map[string]string, payload []byte) (cold, warm time.Duration, answer []byte, output string, err error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	t0 := time.Now()
	e, err := emulator.Start(ctx, rie, bootstrap, env, nil)
	if err != nil {
		return 0, 0, nil, "", err
	}
	answer, err = e.Invoke(ctx, payload)
	cold = time.Since(t0)
	if err == nil {
		err = functionError(answer)
	}
	if err != nil {
		e.Close()
		return 0, 0, nil, "", fmt.Errorf("first invoke: %w\n%s", err, e.Output.String())
	}
	t1 := time.Now()
	if _, err = e.Invoke(ctx, payload); err != nil {
		e.Close()
		return 0, 0, nil, "", fmt.Errorf("second invoke: %w", err)
	}
	warm = time.Since(t1)
	// Close waits for the process, and so for its output to be copied.
	e.Close()
	return cold, warm, answer, e.Output.String(), nil
}

// functionError reports an answer that is a Lambda function error.
func functionError(answer []byte) error {
	var fe struct {
		ErrorMessage string `json:"errorMessage"`
		ErrorType    string `json:"errorType"`
	}
	if json.Unmarshal(answer, &fe) == nil && fe.ErrorMessage != "" {
		return fmt.Errorf("the function failed: %s: %s", fe.ErrorType, fe.ErrorMessage)
	}
	return nil
}

// eventPayload reads a sample event; a CloudFormation event's ResponseURL
// is pointed at the bench's own server.
func eventPayload(path, responseURL string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read event: %w", err)
	}
	var ev map[string]any
	if err := json.Unmarshal(b, &ev); err != nil {
		return nil, fmt.Errorf("event %s: %w", path, err)
	}
	if _, ok := ev["ResponseURL"]; ok {
		ev["ResponseURL"] = responseURL
		return json.Marshal(ev)
	}
	return b, nil
}

func fileSize(path string) (int64, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, fmt.Errorf("%s is missing: %w", path, errors.Unwrap(err))
	}
	return fi.Size(), nil
}

// medianInit is the run whose summed init time is the median.
func medianInit(runs []initSummary) initSummary {
	if len(runs) == 0 {
		return initSummary{}
	}
	best := 0
	times := make([]time.Duration, len(runs))
	for i, r := range runs {
		times[i] = time.Duration(r.ClockMS * 1e6)
	}
	m := median(times)
	for i, t := range times {
		if t == m {
			best = i
			break
		}
	}
	return runs[best]
}
