// Command lambdalocal packages and runs this project's Lambda functions on a
// development machine, without docker:
//
//	lambdalocal zip -o bin/lookup.zip bin/lookup/bootstrap
//	lambdalocal invoke -bootstrap bin/local/lookup/bootstrap -event events/lookup-direct.json [-seed-probe]
//	lambdalocal template -o bin/sam/template.json -code-dir bin
//
// zip writes a deployment package holding one executable file named bootstrap,
// byte-for-byte reproducible (fixed timestamps), so that an unchanged binary
// gives an unchanged CDK asset hash. invoke runs the bootstrap under the AWS
// Lambda Runtime Interface Emulator with the configuration variables of this
// environment, posts the event, prints the response on stdout and the
// function's logs on stderr. template synthesizes a SAM template of the three
// functions over built bootstraps, for `sam local invoke` where docker runs.
package main

import (
	"archive/zip"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemarchive/idemarchive/shared/emulator"
	"github.com/idemarchive/idemarchive/shared/settings"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "lambdalocal:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return errors.New("usage: lambdalocal zip -o OUT.zip BOOTSTRAP | lambdalocal invoke -bootstrap PATH -event FILE [-rie PATH] [-seed-probe] | lambdalocal template -o OUT.json [-code-dir DIR]")
	}
	switch args[0] {
	case "zip":
		return cmdZip(args[1:])
	case "invoke":
		return cmdInvoke(ctx, args[1:], stdout, stderr)
	case "template":
		return cmdTemplate(args[1:], stderr)
	}
	return fmt.Errorf("unknown command %q (want zip, invoke or template)", args[0])
}

func cmdZip(args []string) error {
	fs := flag.NewFlagSet("zip", flag.ContinueOnError)
	out := fs.String("o", "", "zip file to write")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" || fs.NArg() != 1 {
		return errors.New("usage: lambdalocal zip -o OUT.zip BOOTSTRAP")
	}
	bin, err := os.ReadFile(fs.Arg(0))
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	hdr := &zip.FileHeader{Name: "bootstrap", Method: zip.Deflate, Modified: time.Date(1980, 1, 1, 0, 0, 0, 0, time.UTC)}
	hdr.SetMode(0o755) // Lambda runs bootstrap as an executable
	w, err := zw.CreateHeader(hdr)
	if err != nil {
		return err
	}
	if _, err := w.Write(bin); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	return os.WriteFile(*out, buf.Bytes(), 0o644)
}

// probeSQL archives the runbook's verification probe, so that the lookup
// sample events find a row.
const probeSQL = `
INSERT INTO idempotency_key_archive (scoped_key, fingerprint, status_code, resource_id, created_at, expired_at)
SELECT 'idem:v1:probe', '\x00', 201, 'ch_probe', now() - interval '30 hours', now() - interval '6 hours'
 WHERE NOT EXISTS (SELECT 1 FROM idempotency_key_archive WHERE scoped_key = 'idem:v1:probe')`

func cmdInvoke(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("invoke", flag.ContinueOnError)
	bootstrap := fs.String("bootstrap", "", "path of the bootstrap binary (built for this machine)")
	event := fs.String("event", "", "JSON event file to send")
	rie := fs.String("rie", filepath.Join("bin", "tools", "aws-lambda-rie"), "path of aws-lambda-rie")
	seed := fs.Bool("seed-probe", false, "archive the runbook's probe key idem:v1:probe first")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *bootstrap == "" || *event == "" {
		return errors.New("usage: lambdalocal invoke -bootstrap PATH -event FILE [-rie PATH] [-seed-probe]")
	}
	payload, err := os.ReadFile(*event)
	if err != nil {
		return err
	}
	if *seed {
		conn, err := pgx.Connect(ctx, os.Getenv("DATABASE_URL"))
		if err != nil {
			return fmt.Errorf("seed probe: connect: %w", err)
		}
		_, err = conn.Exec(ctx, probeSQL)
		conn.Close(ctx)
		if err != nil {
			return fmt.Errorf("seed probe: %w", err)
		}
	}
	env := map[string]string{}
	for _, v := range settings.Variables {
		if val, ok := os.LookupEnv(v.Name); ok {
			env[v.Name] = val
		}
	}
	startCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	e, err := emulator.Start(startCtx, *rie, *bootstrap, env, stderr)
	if err != nil {
		return err
	}
	defer e.Close()
	out, err := e.Invoke(ctx, payload)
	if err != nil {
		return err
	}
	var pretty bytes.Buffer
	if json.Indent(&pretty, out, "", "  ") != nil {
		pretty.Reset()
		pretty.Write(out)
	}
	pretty.WriteByte('\n')
	_, err = stdout.Write(pretty.Bytes())
	return err
}

// stripPassword removes the password from a PostgreSQL connection string, URL
// (postgres://user:pw@host/db) or keyword form (password=pw), and the client
// key's passphrase (sslpassword) with it, and reports whether there was one.
func stripPassword(dsn string) (string, bool) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			// Unparseable: keep nothing of it rather than risk the password.
			return "", true
		}
		stripped := false
		if u.User != nil {
			if _, ok := u.User.Password(); ok {
				u.User = url.User(u.User.Username())
				stripped = true
			}
		}
		if q := u.Query(); q.Has("password") || q.Has("sslpassword") {
			q.Del("password")
			q.Del("sslpassword")
			u.RawQuery = q.Encode()
			stripped = true
		}
		return u.String(), stripped
	}
	kept := passwordKeyword.ReplaceAllString(dsn, "")
	return strings.TrimSpace(kept), kept != dsn
}

// passwordKeyword matches password=... and sslpassword=... in a keyword/value
// connection string, quoted ('p w', with \' escapes) or not. An unquoted
// value ends at the first space that no '\' escapes, as libpq and pgx read
// it ("p\ w" is one value): ending it at any space would leave the rest of
// the secret in the template.
var passwordKeyword = regexp.MustCompile(`(^|\s)(ssl)?password\s*=\s*('(\\.|[^'\\])*'|(\\.|[^\s\\])*\\?)`)

// samFunctions are the functions of the SAM template, with the timeouts the
// deployed stack gives them by default (infra/stack: the sweep's is its
// 5-minute interval less one minute; the partition manager's 5 minutes), so
// that a local run stops where a deployed one does (the sweep's deadline
// margin counts from its timeout).
var samFunctions = []struct {
	logicalID, dir string
	timeout        int
}{
	{"SweepFunction", "sweep", 240},
	{"PartitionsFunction", "partitions", 300},
	{"LookupFunction", "lookup", 10},
}

func cmdTemplate(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("template", flag.ContinueOnError)
	out := fs.String("o", "", "template file to write")
	codeDir := fs.String("code-dir", "bin", "directory holding <function>/bootstrap, relative to the template's directory or absolute")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" {
		return errors.New("usage: lambdalocal template -o OUT.json [-code-dir DIR]")
	}
	env := map[string]string{}
	for _, v := range settings.Variables {
		if val, ok := os.LookupEnv(v.Name); ok {
			env[v.Name] = val
		}
	}
	if env["DATABASE_URL"] == "" && env["DATABASE_SECRET_ARN"] == "" {
		return errors.New("set DATABASE_URL (or DATABASE_SECRET_ARN) first: the template's functions get their configuration from this shell's variables, and have none without a database")
	}
	// A template is a file that gets shared and committed: the password
	// (and a client key's passphrase) never goes into it. PGPASSWORD and
	// PGSSLPASSWORD are declared empty so that `sam local invoke --env-vars`
	// can supply them at invoke time; pgx ignores them empty.
	if u, stripped := stripPassword(env["DATABASE_URL"]); stripped {
		env["DATABASE_URL"] = u
		env["PGPASSWORD"], env["PGSSLPASSWORD"] = "", ""
		fmt.Fprintln(stderr, `lambdalocal: the password in DATABASE_URL was left out of the template; give it at invoke time:`)
		fmt.Fprintln(stderr, `  echo '{"Parameters": {"PGPASSWORD": "..."}}' > bin/sam/env.json  # keep it out of version control`)
		fmt.Fprintln(stderr, `  sam local invoke -t bin/sam/template.json --env-vars bin/sam/env.json LookupFunction -e events/lookup-direct.json`)
	}
	resources := map[string]any{}
	for _, f := range samFunctions {
		resources[f.logicalID] = map[string]any{
			"Type": "AWS::Serverless::Function",
			"Properties": map[string]any{
				"CodeUri":       filepath.Join(*codeDir, f.dir),
				"Handler":       "bootstrap",
				"Runtime":       "provided.al2023",
				"Architectures": []string{"arm64"},
				"MemorySize":    256,
				"Timeout":       f.timeout,
				"Tracing":       "Active",
				"Environment":   map[string]any{"Variables": env},
			},
		}
	}
	doc := map[string]any{
		"AWSTemplateFormatVersion": "2010-09-09",
		"Transform":                "AWS::Serverless-2016-10-31",
		"Description":              "Idempotency key archive functions for sam local invoke (generated by lambdalocal template)",
		"Resources":                resources,
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
		return err
	}
	return os.WriteFile(*out, append(b, '\n'), 0o644)
}
