package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/testenv"
)

// buildDemo builds what `make demo` runs into a temporary bin directory.
func buildDemo(t *testing.T) paths {
	t.Helper()
	root := testenv.RepoRoot(t)
	bin := t.TempDir()
	for _, b := range []struct{ out, pkg, tags string }{
		{"archivectl", "./cmd/archivectl", ""},
		{"charges", "./examples/charges", ""},
		{"local/sweep/bootstrap", "./functions/sweep", "lambda.norpc"},
		{"local/partitions/bootstrap", "./functions/partitions", "lambda.norpc"},
	} {
		cmd := exec.Command("go", "build", "-trimpath", "-tags", b.tags, "-o", filepath.Join(bin, b.out), b.pkg)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "go build %s: %s", b.pkg, out)
	}
	return paths{bin: bin, rie: testenv.RIEBinary(t), events: filepath.Join(root, "events")}
}

// cancelAfter cancels once what has been written.
type cancelAfter struct {
	mu       sync.Mutex
	buf      bytes.Buffer
	what     string
	cancel   context.CancelFunc
	canceled time.Time
}

func (c *cancelAfter) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.buf.Write(p)
	if c.canceled.IsZero() && strings.Contains(c.buf.String(), c.what) {
		c.canceled = time.Now()
		c.cancel()
	}
	return len(p), nil
}

func TestAnInterruptedDemo(t *testing.T) {
	p := buildDemo(t)
	db := dbtest.New(t)

	// Ctrl-C while the demo waits out the keys' TTL (20 s here) stops it
	// at once, said as an interrupt, not as the next step failing.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := &cancelAfter{what: "an immediate retry replayed", cancel: cancel}
	d := &demo{paths: p, ttl: 20 * time.Second, out: w, dbURL: db.URL, runID: newRunID()}
	require.False(t, d.run(ctx))
	took := time.Since(w.canceled)
	out := w.buf.String()
	require.Less(t, took, 5*time.Second, "the demo ran on %s after the interrupt:\n%s", took, out)
	require.Contains(t, out, "stop  interrupted: wait for the keys to expire")
	require.Contains(t, out, "Interrupted after 4 checks (0 failed)")
	require.NotContains(t, out, "FAIL", "an interrupt was reported as a failure")

	// So is Ctrl-C at any other step: during a request, or after the
	// sweep, once, and the steps left say nothing.
	for _, after := range []string{"created 3 charges", "the sweep function moved"} {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		w := &cancelAfter{what: after, cancel: cancel}
		d := &demo{paths: p, ttl: 4 * time.Second, out: w, dbURL: db.URL, runID: newRunID()}
		require.False(t, d.run(ctx))
		cancel()
		out := w.buf.String()
		require.Contains(t, out, "Interrupted after", after)
		require.Equal(t, 1, strings.Count(out, "stop  interrupted"), "%s:\n%s", after, out)
		require.NotContains(t, out, "FAIL", "an interrupt was reported as a failed step:\n%s", out)
	}

	// The first run left its three expired keys in the live table (its
	// TTL passes while this test waits), and the second may have left
	// some: the next run's sweep moves them too, and every check holds
	// all the same.
	time.Sleep(time.Until(w.canceled.Add(20 * time.Second)))
	var next bytes.Buffer
	ctx2, cancel2 := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel2()
	d2 := &demo{paths: p, ttl: 4 * time.Second, out: &next, dbURL: db.URL, runID: newRunID()}
	require.True(t, d2.run(ctx2), "the run after an interrupted one:\n%s", next.String())
	require.Regexp(t, `the sweep function moved \d+ into the archive, this run's 3 of 3 among them`, next.String())
}
