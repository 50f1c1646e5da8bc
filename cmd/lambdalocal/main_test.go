package main

import (
	"archive/zip"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/testenv"
)

func TestZipIsAnExecutableBootstrapAndReproducible(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bin := filepath.Join(dir, "bootstrap")
	require.NoError(t, os.WriteFile(bin, []byte("\x7fELF fake binary"), 0o755))
	a, b := filepath.Join(dir, "a.zip"), filepath.Join(dir, "b.zip")
	require.NoError(t, run(context.Background(), []string{"zip", "-o", a, bin}, io.Discard, io.Discard))
	require.NoError(t, run(context.Background(), []string{"zip", "-o", b, bin}, io.Discard, io.Discard))
	za, err := os.ReadFile(a)
	require.NoError(t, err)
	zb, err := os.ReadFile(b)
	require.NoError(t, err)
	require.Equal(t, za, zb, "same binary, same bytes")

	r, err := zip.NewReader(bytes.NewReader(za), int64(len(za)))
	require.NoError(t, err)
	require.Len(t, r.File, 1)
	require.Equal(t, "bootstrap", r.File[0].Name)
	require.Equal(t, os.FileMode(0o755), r.File[0].Mode().Perm())
	f, err := r.File[0].Open()
	require.NoError(t, err)
	content, err := io.ReadAll(f)
	require.NoError(t, err)
	require.Equal(t, "\x7fELF fake binary", string(content))
}

func TestTemplateDescribesTheThreeFunctions(t *testing.T) {
	t.Setenv("LIVE_TTL", "48h")
	t.Setenv("DATABASE_URL", "postgres://archive:s3cret@db.example.com:5432/app?sslmode=verify-full")
	out := filepath.Join(t.TempDir(), "sam", "template.json")
	require.NoError(t, run(context.Background(), []string{"template", "-o", out, "-code-dir", "../bin"}, io.Discard, io.Discard))
	raw, err := os.ReadFile(out)
	require.NoError(t, err)
	var doc struct {
		Transform string
		Resources map[string]struct {
			Type       string
			Properties struct {
				CodeUri, Handler, Runtime string
				Timeout                   int
				Architectures             []string
				Environment               struct{ Variables map[string]string }
			}
		}
	}
	require.NoError(t, json.Unmarshal(raw, &doc))
	require.Equal(t, "AWS::Serverless-2016-10-31", doc.Transform)
	require.Len(t, doc.Resources, 3)
	lookup := doc.Resources["LookupFunction"]
	require.Equal(t, "AWS::Serverless::Function", lookup.Type)
	require.Equal(t, "../bin/lookup", lookup.Properties.CodeUri)
	require.Equal(t, "bootstrap", lookup.Properties.Handler)
	require.Equal(t, "provided.al2023", lookup.Properties.Runtime)
	require.Equal(t, []string{"arm64"}, lookup.Properties.Architectures)
	require.Equal(t, "48h", lookup.Properties.Environment.Variables["LIVE_TTL"])
	require.NotContains(t, string(raw), "s3cret", "the password never goes into the template")
	require.Equal(t, "postgres://archive@db.example.com:5432/app?sslmode=verify-full", lookup.Properties.Environment.Variables["DATABASE_URL"])
	require.Contains(t, lookup.Properties.Environment.Variables, "PGPASSWORD", "declared, for --env-vars")
	// AND each function has the deployed stack's default timeout
	for fn, seconds := range map[string]int{"SweepFunction": 240, "PartitionsFunction": 300, "LookupFunction": 10} {
		require.Equal(t, seconds, doc.Resources[fn].Properties.Timeout, fn)
	}
}

// A sweep whose deadline margin leaves it no time, or a partitions run
// shorter than one DDL statement, fails every local run: the template's
// timeouts grow with the shell's settings, as the stack's do, and settings
// no Lambda timeout holds are refused.
func TestTemplateTimeoutsFollowTheShellsSettings(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://archive@127.0.0.1:5432/app")
	t.Setenv("SWEEP_STATEMENT_TIMEOUT", "3m")
	t.Setenv("SWEEP_DEADLINE_MARGIN", "4m")
	t.Setenv("PARTITION_STATEMENT_TIMEOUT", "10m")
	t.Setenv("PARTITION_LOCK_TIMEOUT", "10m0.5s")
	out := filepath.Join(t.TempDir(), "template.json")
	require.NoError(t, run(context.Background(), []string{"template", "-o", out}, io.Discard, io.Discard))
	raw, err := os.ReadFile(out)
	require.NoError(t, err)
	var doc struct {
		Resources map[string]struct{ Properties struct{ Timeout int } }
	}
	require.NoError(t, json.Unmarshal(raw, &doc))
	require.Equal(t, 250, doc.Resources["SweepFunction"].Properties.Timeout, "the margin and 10 s to start batches in")
	require.Equal(t, 721, doc.Resources["PartitionsFunction"].Properties.Timeout, "the longest statement and 2 minutes, in whole seconds up")
	require.Equal(t, 10, doc.Resources["LookupFunction"].Properties.Timeout)

	t.Setenv("SWEEP_STATEMENT_TIMEOUT", "14m")
	t.Setenv("SWEEP_DEADLINE_MARGIN", "14m55s")
	err = run(context.Background(), []string{"template", "-o", out}, io.Discard, io.Discard)
	require.ErrorContains(t, err, "the sweep's deadline margin (14m55s")
	t.Setenv("SWEEP_STATEMENT_TIMEOUT", "")
	t.Setenv("SWEEP_DEADLINE_MARGIN", "")
	t.Setenv("PARTITION_STATEMENT_TIMEOUT", "13m1s")
	t.Setenv("PARTITION_LOCK_TIMEOUT", "")
	err = run(context.Background(), []string{"template", "-o", out}, io.Discard, io.Discard)
	require.ErrorContains(t, err, "PARTITION_STATEMENT_TIMEOUT or PARTITION_LOCK_TIMEOUT (13m1s)")
	t.Setenv("PARTITION_STATEMENT_TIMEOUT", "soon")
	err = run(context.Background(), []string{"template", "-o", out}, io.Discard, io.Discard)
	require.ErrorContains(t, err, "this shell's timeouts")
	require.ErrorContains(t, err, "PARTITION_STATEMENT_TIMEOUT")
}

func TestTemplateNeedsADatabaseAndKeepsPasswordsOut(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	t.Setenv("DATABASE_SECRET_ARN", "")
	err := run(context.Background(), []string{"template", "-o", filepath.Join(t.TempDir(), "t.json")}, io.Discard, io.Discard)
	require.ErrorContains(t, err, "set DATABASE_URL (or DATABASE_SECRET_ARN) first")

	for dsn, want := range map[string]string{
		"postgres://u:pw@h/db":                "postgres://u@h/db",
		"postgresql://u@h/db?password=pw&x=1": "postgresql://u@h/db?x=1",
		"host=h user=u password=pw dbname=d":  "host=h user=u dbname=d",
		"host=h password='p w\\' x' dbname=d": "host=h dbname=d",
		"password=pw host=h":                  "host=h",
		"postgres://u:p%zz@h/db":              "",
	} {
		got, stripped := stripPassword(dsn)
		require.True(t, stripped, dsn)
		require.Equal(t, want, strings.Join(strings.Fields(got), " "), dsn)
		require.NotContains(t, got, "pw", dsn)
	}
	got, stripped := stripPassword("postgres://u@h/db")
	require.False(t, stripped)
	require.Equal(t, "postgres://u@h/db", got)
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{nil, {"bogus"}, {"zip"}, {"invoke"}, {"template"}, {"zip", "-o", "x.zip", "/nonexistent"}} {
		require.Error(t, run(context.Background(), args, io.Discard, io.Discard), "%q", args)
	}
}

// invoke runs a real bootstrap under the emulator, as `make invoke` does.
func TestInvokeRunsTheBootstrapUnderTheEmulator(t *testing.T) {
	db := dbtest.New(t)
	db.Partition(t, 0)
	t.Setenv("DATABASE_URL", db.URL)
	var out, logs bytes.Buffer
	err := run(context.Background(), []string{"invoke",
		"-rie", testenv.RIEBinary(t),
		"-bootstrap", testenv.Bootstraps(t, "lookup")["lookup"],
		"-event", filepath.Join(testenv.RepoRoot(t), "events", "lookup-direct.json"),
		"-seed-probe"}, &out, &logs)
	require.NoError(t, err, logs.String())
	var resp struct {
		Status int
		Record struct {
			ResourceID string `json:"resource_id"`
		}
	}
	require.NoError(t, json.Unmarshal(out.Bytes(), &resp), out.String())
	require.Equal(t, 200, resp.Status)
	require.Equal(t, "ch_probe", resp.Record.ResourceID)
	require.Contains(t, logs.String(), "START RequestId", "the function's logs go to stderr")

	// A function that fails (an option it does not know) fails the
	// command too, its error object still printed.
	event := filepath.Join(t.TempDir(), "bad.json")
	require.NoError(t, os.WriteFile(event, []byte(`{"batchsize": 1}`), 0o600))
	out.Reset()
	err = run(context.Background(), []string{"invoke",
		"-rie", testenv.RIEBinary(t),
		"-bootstrap", testenv.Bootstraps(t, "sweep")["sweep"],
		"-event", event}, &out, &logs)
	require.ErrorContains(t, err, `the function failed: invalid options: json: unknown field "batchsize"`)
	require.Contains(t, out.String(), `"errorMessage"`)
}
