// Command demo runs the runbook end to end on this machine and reports what
// held: charges are created through the demo API, their keys expire (a live
// TTL of seconds), the partitions and sweep functions run as real bootstrap
// binaries under the AWS Lambda Runtime Interface Emulator, a late retry gets
// 409 idempotency_key_expired with the original resource id, a retry with a
// changed body gets 422, the runbook's probe works, and archivectl verify
// prints its table. It exits 0 when everything held.
//
// `make demo` builds what it needs and runs it against a throwaway PostgreSQL.
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemarchive/idemarchive/shared/emulator"
	"github.com/idemarchive/idemarchive/shared/idempotency"
)

type paths struct {
	bin, rie, events string
}

func main() {
	// SIGTERM too: the API and the emulators it started stop with it.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var p paths
	flag.StringVar(&p.bin, "bin", "bin", "directory holding archivectl, charges and local/<fn>/bootstrap")
	flag.StringVar(&p.rie, "rie", filepath.Join("bin", "tools", "aws-lambda-rie"), "path of aws-lambda-rie")
	flag.StringVar(&p.events, "events", "events", "directory of the sample events")
	ttl := flag.Duration("ttl", 4*time.Second, "live TTL of the demo API (the first steps must finish within it)")
	flag.Parse()

	d := &demo{paths: p, ttl: *ttl, out: os.Stdout, dbURL: os.Getenv("DATABASE_URL"), runID: newRunID()}
	if d.dbURL == "" {
		fmt.Fprintln(os.Stderr, "demo: DATABASE_URL is not set: run `make demo`, which starts a throwaway PostgreSQL")
		os.Exit(2)
	}
	if !d.run(ctx) {
		os.Exit(1)
	}
}

type demo struct {
	paths
	ttl    time.Duration
	out    io.Writer
	dbURL  string
	step   int
	failed int
	// interrupted is set when a step stopped on the run's context ctx
	// (Ctrl-C, SIGTERM): said as such, not as that step failing.
	interrupted bool
	ctx         context.Context
	api         string
	logs        bytes.Buffer // charges API output, shown on failure
	// run sets this run's keys apart from an earlier run's in the same
	// database (a DATABASE_URL of yours): their archive rows would answer
	// this run's first requests 409.
	runID string
}

// key is the idempotency key of this run's order n.
func (d *demo) key(n int) string { return fmt.Sprintf("demo-order-%d-%s", n, d.runID) }

// newRunID is a random hex id for a run.
func newRunID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func (d *demo) check(ok bool, what, detail string) bool {
	if !ok && d.ctx != nil && d.ctx.Err() != nil {
		// The user's Ctrl-C (or SIGTERM) made the step fail, not the
		// system: said once, and the steps left say nothing.
		d.stop(what)
		return false
	}
	if d.interrupted {
		return ok
	}
	d.step++
	mark := "ok  "
	if !ok {
		mark = "FAIL"
		d.failed++
	}
	fmt.Fprintf(d.out, "%2d  %s  %s\n", d.step, mark, what)
	if detail != "" {
		for _, line := range strings.Split(strings.TrimRight(detail, "\n"), "\n") {
			fmt.Fprintf(d.out, "          %s\n", line)
		}
	}
	return ok
}

func (d *demo) fail(what string, err error) bool {
	if errors.Is(err, context.Canceled) {
		// The user's Ctrl-C (or SIGTERM), not a failure of the step.
		d.stop(what)
		return false
	}
	return d.check(false, what, err.Error())
}

// stop says, once, that the run was interrupted during what.
func (d *demo) stop(what string) {
	if !d.interrupted {
		d.interrupted = true
		fmt.Fprintf(d.out, "    stop  interrupted: %s\n", what)
	}
}

// wait waits for dur, or less if ctx ends first; it reports whether dur
// passed.
func (d *demo) wait(ctx context.Context, dur time.Duration) bool {
	t := time.NewTimer(dur)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// whereAreTheKeys counts this run's first n keys in the archive and in the
// live table.
func (d *demo) whereAreTheKeys(ctx context.Context, n int) (archived, live int, err error) {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = idempotency.ScopedKey("", d.key(i+1))
	}
	conn, err := pgx.Connect(ctx, d.dbURL)
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close(ctx)
	err = conn.QueryRow(ctx, countKeysSQL, keys).Scan(&archived, &live)
	return archived, live, err
}

// countKeysSQL counts the keys $1 in the archive and in the live table.
const countKeysSQL = `
SELECT (SELECT count(*) FROM idempotency_key_archive WHERE scoped_key = ANY($1)),
       (SELECT count(*) FROM idempotency_keys WHERE scoped_key = ANY($1))`

func (d *demo) run(ctx context.Context) bool {
	d.ctx = ctx
	fmt.Fprintf(d.out, "Idempotency key archive: the runbook end to end (live TTL %s)\n\n", d.ttl)
	ok := d.steps(ctx)
	fmt.Fprintln(d.out)
	if ok && d.failed == 0 {
		fmt.Fprintf(d.out, "All %d checks held: late retries are answered from the archive, never charged twice.\n", d.step)
		return true
	}
	if d.interrupted || ctx.Err() != nil {
		fmt.Fprintf(d.out, "Interrupted after %d checks (%d failed); everything it started was stopped.\n", d.step, d.failed)
		return false
	}
	fmt.Fprintf(d.out, "%d of %d checks failed.\n", d.failed, d.step)
	if d.logs.Len() > 0 {
		fmt.Fprintf(d.out, "\ncharges API output:\n%s", d.logs.String())
	}
	return false
}

func (d *demo) steps(ctx context.Context) bool {
	// 1. Schema.
	if out, err := d.archivectl(ctx, "migrate"); err != nil {
		return d.fail("migrate the schema (archivectl migrate)", fmt.Errorf("%w\n%s", err, out))
	}
	d.check(true, "schema migrated (archivectl migrate)", "")

	// 2. Partitions, through the real function.
	env := map[string]string{"DATABASE_URL": d.dbURL, "SWEEP_PAUSE": "10ms"}
	partitions, err := d.function(ctx, "partitions", env)
	if err != nil {
		return d.fail("start the partitions function", err)
	}
	defer partitions.Close()
	var parts struct{ Created []string }
	if err := d.invoke(ctx, partitions, "partitions-schedule.json", &parts); err != nil {
		return d.fail("partitions function", err)
	}
	d.check(len(parts.Created) >= 3 || d.partitionsExist(ctx), "partitions function (real bootstrap under the Lambda emulator) prepared the archive",
		fmt.Sprintf("created: %s", strings.Join(parts.Created, ", ")))

	// 3. The charges API, with a live TTL of seconds.
	stopAPI, err := d.startAPI(ctx)
	if err != nil {
		return d.fail("start the charges API", err)
	}
	defer stopAPI()
	bodies := []string{`{"amount":4500,"currency":"gbp"}`, `{"amount":1200,"currency":"eur"}`, `{"amount":999,"currency":"usd"}`}
	ids := make([]string, len(bodies))
	for i, body := range bodies {
		status, _, resp, err := d.post(ctx, d.key(i+1), body)
		if err != nil || status != http.StatusCreated {
			return d.check(false, "create charges through the API", fmt.Sprintf("status %d %v %s", status, err, resp))
		}
		ids[i] = str(resp, "id")
	}
	d.check(true, fmt.Sprintf("created %d charges through POST /v1/charges on %s", len(ids), d.api), strings.Join(ids, ", "))

	// 4. An immediate retry replays.
	status, hdr, resp, err := d.post(ctx, d.key(1), bodies[0])
	d.check(err == nil && status == http.StatusCreated && hdr.Get("Idempotent-Replayed") == "true" && str(resp, "id") == ids[0],
		"an immediate retry replayed the first answer (Idempotent-Replayed: true, same charge id)", "")

	// 5. Keys expire; the sweep function archives them.
	if !d.wait(ctx, d.ttl+500*time.Millisecond) {
		return d.fail("wait for the keys to expire", ctx.Err())
	}
	sweeper, err := d.function(ctx, "sweep", env)
	if err != nil {
		return d.fail("start the sweep function", err)
	}
	defer sweeper.Close()
	var swept struct {
		Moved   int64
		Drained bool
		Backlog int64
	}
	if err := d.invoke(ctx, sweeper, "sweep-schedule.json", &swept); err != nil {
		return d.fail("sweep function", err)
	}
	// The sweep moves every expired key of the database, an earlier
	// run's that was interrupted included: this run's three must be
	// among them, archived and no longer live.
	archived, live, err := d.whereAreTheKeys(ctx, len(ids))
	d.check(err == nil && archived == len(ids) && live == 0 && swept.Drained && swept.Backlog == 0,
		fmt.Sprintf("keys expired after %s; the sweep function moved %d into the archive, this run's %d of %d among them (backlog %d)", d.ttl, swept.Moved, archived, len(ids), swept.Backlog),
		errText(err))

	// 6. A late retry: 409 with the original resource id, no second charge.
	status, _, resp, err = d.post(ctx, d.key(1), bodies[0])
	ok := err == nil && status == http.StatusConflict && str(resp, "code") == "idempotency_key_expired" && str(resp, "resource_id") == ids[0]
	d.check(ok, "a late retry got 409 idempotency_key_expired with the original resource id",
		summary(ok, resp, fmt.Sprintf("resource_id %s, first used %s, expired %s", str(resp, "resource_id"), str(resp, "created_at"), str(resp, "expired_at"))))
	got, err := d.get(ctx, "/v1/charges/"+str(resp, "resource_id"))
	d.check(err == nil && str(got, "id") == ids[0], "the client reconciles: GET /v1/charges/{resource_id} returns the original charge", "")

	// 7. The same expired key with a changed body: 422.
	status, _, resp, err = d.post(ctx, d.key(2), `{"amount":5000,"currency":"eur"}`)
	ok = err == nil && status == http.StatusUnprocessableEntity && str(resp, "code") == "idempotency_key_reused"
	d.check(ok, "a late retry with a changed body got 422 idempotency_key_reused", summary(ok, resp, ""))

	// No retry ran the handler again.
	var all struct{ Data []json.RawMessage }
	list, err := d.get(ctx, "/v1/charges")
	d.check(err == nil && json.Unmarshal(list, &all) == nil && len(all.Data) == len(ids),
		fmt.Sprintf("the API holds %d charges: no retry charged twice", len(all.Data)), "")

	// 8. The runbook's probe, verbatim in substance: INSERT, then POST.
	if err := d.insertProbe(ctx); err != nil {
		return d.fail("insert the runbook's probe", err)
	}
	status, _, resp, err = d.post(ctx, "probe", `{"amount":4500,"currency":"gbp"}`)
	d.check(err == nil && status == http.StatusConflict && str(resp, "code") == "idempotency_key_expired",
		"the runbook's probe: an archived key 'probe' answers idempotency_key_expired", "")

	// 9. archivectl verify.
	out, err := d.archivectl(ctx, "verify")
	d.check(err == nil, "archivectl verify: the runbook's four checks, the recording check and the tables' integrity", out)
	return true
}

// summary is the short line on success, the whole answer on failure.
func summary(ok bool, resp []byte, short string) string {
	if ok {
		return short
	}
	return string(resp)
}

func str(doc []byte, field string) string {
	var m map[string]any
	if json.Unmarshal(doc, &m) != nil {
		return ""
	}
	s, _ := m[field].(string)
	return s
}

func (d *demo) archivectl(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(d.bin, "archivectl"), args...)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+d.dbURL)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

func (d *demo) function(ctx context.Context, name string, env map[string]string) (*emulator.Emulator, error) {
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	return emulator.Start(sctx, d.rie, filepath.Join(d.bin, "local", name, "bootstrap"), env, nil)
}

func (d *demo) invoke(ctx context.Context, e *emulator.Emulator, event string, v any) error {
	payload, err := os.ReadFile(filepath.Join(d.events, event))
	if err != nil {
		return err
	}
	out, err := e.Invoke(ctx, payload)
	if err != nil {
		return fmt.Errorf("%w\n%s", err, e.Output.String())
	}
	if err := json.Unmarshal(out, v); err != nil || bytes.Contains(out, []byte(`"errorMessage"`)) {
		return fmt.Errorf("unexpected answer %s\n%s", out, e.Output.String())
	}
	return nil
}

func (d *demo) partitionsExist(ctx context.Context) bool {
	out, err := d.archivectl(ctx, "partitions", "--dry-run")
	return err == nil && strings.Contains(out, "nothing to do")
}

func (d *demo) startAPI(ctx context.Context) (func(), error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := l.Addr().String()
	l.Close()
	cmd := exec.Command(filepath.Join(d.bin, "charges"))
	cmd.Env = append(os.Environ(), "DATABASE_URL="+d.dbURL, "ADDR="+addr, "LIVE_TTL="+d.ttl.String())
	cmd.Stdout, cmd.Stderr = &d.logs, &d.logs
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	stop := func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		if c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
			c.Close()
			d.api = addr
			return stop, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			stop()
			return nil, errors.New("the charges API did not start")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (d *demo) post(ctx context.Context, key, body string) (int, http.Header, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+d.api+"/v1/charges", strings.NewReader(body))
	if err != nil {
		return 0, nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, bytes.TrimSpace(b), err
}

func (d *demo) get(ctx context.Context, path string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+d.api+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}

// insertProbe is the runbook's psql INSERT.
func (d *demo) insertProbe(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, d.dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `INSERT INTO idempotency_key_archive
		(scoped_key, fingerprint, status_code, resource_id, created_at, expired_at)
		VALUES ('idem:v1:probe', '\x00', 201, 'ch_probe', now() - interval '30 hours', now() - interval '6 hours')
		ON CONFLICT DO NOTHING`)
	return err
}
