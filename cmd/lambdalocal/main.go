// Command lambdalocal packages and runs this project's Lambda functions on a
// development machine, without docker:
//
//	lambdalocal zip -o bin/lookup.zip bin/lookup/bootstrap
//	lambdalocal invoke -bootstrap bin/local/lookup/bootstrap -event events/lookup-direct.json [-seed-probe]
//	lambdalocal template -o bin/sam/template.json -code-dir ..
//
// zip writes a deployment package holding one executable file named bootstrap,
// byte-for-byte reproducible (fixed timestamps), so that an unchanged binary
// gives an unchanged CDK asset hash. invoke runs the bootstrap under the AWS
// Lambda Runtime Interface Emulator with the configuration variables of this
// environment (the project's settings, and the PG* and AWS_* variables pgx
// and the AWS SDK read), posts the event, prints the response on stdout and the
// function's logs on stderr. template synthesizes a SAM template of the three
// functions over built bootstraps, for `sam local invoke` where docker runs.
package main

import (
	"archive/zip"
	"bytes"
	"cmp"
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
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/aws/aws-xray-sdk-go/v2/daemoncfg"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemarchive/idemarchive/shared/emulator"
	"github.com/idemarchive/idemarchive/shared/settings"
)

func main() {
	// SIGTERM too: stopped either way, it stops the emulator and the function
	// it runs rather than leave them behind.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
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

// connectForProbe connects as the functions would: DATABASE_URL and the
// settings beside it read and checked as they read them, whose errors never
// echo the connection string (pgx's own parse errors hide only a password
// written password=value, not libpq's "password = value" or an escaped
// blank).
func connectForProbe(ctx context.Context) (*pgx.Conn, error) {
	s, err := settings.FromEnv(os.Getenv)
	if err != nil {
		return nil, errors.New(settings.Redact(err.Error()))
	}
	if s.Database.URL == "" {
		return nil, errors.New("DATABASE_URL is not set")
	}
	cfg, err := s.Database.PoolConfig()
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg.ConnConfig)
	if err != nil {
		return nil, fmt.Errorf("connect: %s", settings.Redact(err.Error()))
	}
	return conn, nil
}

func cmdInvoke(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("invoke", flag.ContinueOnError)
	bootstrap := fs.String("bootstrap", "", "path of the bootstrap binary (built for this machine)")
	event := fs.String("event", "", "JSON event file to send")
	rie := fs.String("rie", filepath.Join("bin", "tools", "aws-lambda-rie"), "path of aws-lambda-rie")
	seed := fs.Bool("seed-probe", false, "archive the runbook's probe key idem:v1:probe first")
	function := fs.String("function", "", "which function the bootstrap is (sweep, partitions, lookup, migrate), for the timeout the stack gives it (default: the bootstrap's directory name)")
	timeout := fs.Duration("timeout", 0, "the function's timeout, in whole seconds up to 15m (default: AWS_LAMBDA_FUNCTION_TIMEOUT if set, else the deployed function's for this shell's settings)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *bootstrap == "" || *event == "" {
		return errors.New("usage: lambdalocal invoke -bootstrap PATH -event FILE [-rie PATH] [-seed-probe] [-function NAME] [-timeout DURATION]")
	}
	payload, err := os.ReadFile(*event)
	if err != nil {
		return err
	}
	if len(payload) > maxSyncPayload {
		// The emulator would cut it short without a word, and the
		// function would answer about JSON that ends too soon.
		return fmt.Errorf("%s is %d bytes: Lambda refuses a synchronous invocation's event over %d bytes (6 MB)", *event, len(payload), maxSyncPayload)
	}
	env := functionEnv(os.Environ())
	if err := checkXRayDaemonAddress(env[xrayDaemonAddress]); err != nil {
		return err
	}
	timeoutSet := false
	fs.Visit(func(f *flag.Flag) { timeoutSet = timeoutSet || f.Name == "timeout" })
	name := cmp.Or(*function, filepath.Base(filepath.Dir(*bootstrap)))
	secs, err := invokeTimeout(timeoutSet, *timeout, env[functionTimeoutVar], name)
	if err != nil {
		return err
	}
	if secs != "" {
		env[functionTimeoutVar] = secs
	} else {
		delete(env, functionTimeoutVar) // set empty: the emulator's own
	}
	if *seed {
		conn, err := connectForProbe(ctx)
		if err != nil {
			return fmt.Errorf("seed probe: %w", err)
		}
		_, err = conn.Exec(ctx, probeSQL)
		conn.Close(ctx)
		if err != nil {
			return fmt.Errorf("seed probe: %w", err)
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
	if _, err = stdout.Write(pretty.Bytes()); err != nil {
		return err
	}
	// A Go function always answers JSON: anything else is the emulator's
	// own word, which it sends with 200 as well ("Task timed out after
	// 10.00 seconds"): Lambda's Invoke calls that a function error.
	if !json.Valid(out) {
		if bytes.HasPrefix(out, []byte("Task timed out")) {
			return fmt.Errorf("the function timed out: %s", bytes.TrimSpace(out))
		}
		return errors.New("the emulator answered in place of the function (no JSON): the function's log above says why")
	}
	// The emulator answers a function's error with 200 and an error
	// object, as Lambda's Invoke does (with X-Amz-Function-Error): the
	// command fails on it, so that a script or make target sees it.
	var failed struct {
		Message *string `json:"errorMessage"`
		Type    *string `json:"errorType"`
	}
	if json.Unmarshal(out, &failed) == nil && failed.Message != nil && failed.Type != nil {
		return fmt.Errorf("the function failed: %s", *failed.Message)
	}
	return nil
}

// stripPassword removes the password from a PostgreSQL connection string, URL
// (postgres://user:pw@host/db) or keyword form (password=pw), and the client
// key's passphrase (sslpassword) with it, and reports whether there was one.
// A string it cannot read as pgx does comes back empty (and stripped).
func stripPassword(dsn string) (string, bool) {
	r := stripSecrets(dsn)
	return r.dsn, r.stripped
}

// strippedDSN is what stripSecrets makes of a connection string.
type strippedDSN struct {
	dsn      string   // the string trimmed, without its secrets; "" if err
	stripped bool     // a secret was removed (or the whole string, on err)
	secrets  []string // the values removed, as written and decoded
	keys     []string // the keys kept, as pgx names them
	err      error    // the string does not tokenize; never quotes it
}

// stripSecrets removes every password and sslpassword pair from a
// connection string, reading it the way pgx (libpq's rules) does rather than
// with net/url or a pattern: a URL's userinfo password and '&'-separated
// query pairs whose percent-decoded key names a secret; a keyword/value
// string's pairs, tokenized with quotes, '\' escapes and values that may
// run straight into the next keyword. Everything else is kept byte for
// byte. The value is trimmed first, as shared/settings reads it. A key that
// differs from password or sslpassword only in case is removed too (pgx
// would send it to the server as a parameter, a secret all the same).
func stripSecrets(dsn string) strippedDSN {
	s := strings.TrimSpace(dsn)
	var r strippedDSN
	switch {
	case strings.IndexByte(s, 0) >= 0:
		r.err = errors.New("it holds a NUL byte")
	case strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://"):
		r = stripURL(s)
	default:
		r = stripKeywordValue(s)
	}
	if r.err != nil {
		// Unreadable: keep nothing of it rather than risk the password.
		return strippedDSN{stripped: true, secrets: r.secrets, err: r.err}
	}
	if !r.stripped {
		r.dsn = s
	}
	return r
}

func isSecretKey(k string) bool {
	return strings.EqualFold(k, "password") || strings.EqualFold(k, "sslpassword")
}

// connKey is pgx's name for a connection string key (canonicalConnStringKey).
func connKey(k string) string {
	if k == "dbname" {
		return "database"
	}
	return k
}

// stripURL mirrors pgconn's parseURLSettings (libpq's URI parser).
func stripURL(s string) (r strippedDSN) {
	fail := func(msg string) strippedDSN {
		r.err = errors.New(msg)
		return r
	}
	scheme := "postgresql://"
	if !strings.HasPrefix(s, scheme) {
		scheme = "postgres://"
	}
	p := s[len(scheme):]
	var out strings.Builder
	out.WriteString(scheme)
	// Like libpq, only a '/' stops the look-ahead for the userinfo's '@'.
	if i := strings.IndexAny(p, "@/"); i >= 0 && p[i] == '@' {
		user, pw, hasPw := strings.Cut(p[:i], ":")
		if _, err := uriDecode(user); err != nil {
			return fail("its user name is not percent-encoded as a URL's must be")
		}
		if hasPw && pw != "" {
			v, err := uriDecode(pw)
			if err != nil {
				return fail("its password is not percent-encoded as a URL's must be")
			}
			r.secrets = append(r.secrets, pw, v)
			r.stripped = true
		}
		out.WriteString(user)
		out.WriteByte('@')
		p = p[i+1:]
	}
	// The host list, host[:port] or [v6][:port], comma-separated.
	netloc := p
	var hosts, ports strings.Builder
	for {
		if len(p) > 0 && p[0] == '[' {
			end := strings.IndexByte(p, ']')
			if end <= 1 {
				return fail("it has an unterminated or empty IPv6 host address")
			}
			hosts.WriteString(p[1:end])
			p = p[end+1:]
			if len(p) > 0 && !strings.ContainsRune(":/?,", rune(p[0])) {
				return fail("it has an unexpected character after an IPv6 host address")
			}
		} else {
			i := strings.IndexAny(p, ":/?,")
			if i < 0 {
				i = len(p)
			}
			hosts.WriteString(p[:i])
			p = p[i:]
		}
		if len(p) > 0 && p[0] == ':' {
			p = p[1:]
			i := strings.IndexAny(p, "/?,")
			if i < 0 {
				i = len(p)
			}
			ports.WriteString(p[:i])
			p = p[i:]
		}
		if len(p) == 0 || p[0] != ',' {
			break
		}
		p = p[1:]
		hosts.WriteByte(',')
		ports.WriteByte(',')
	}
	if _, err := uriDecode(hosts.String()); err != nil {
		return fail("its host list is not percent-encoded as a URL's must be")
	}
	if _, err := uriDecode(ports.String()); err != nil {
		return fail("its port list is not percent-encoded as a URL's must be")
	}
	out.WriteString(netloc[:len(netloc)-len(p)])
	r.keys = []string{"user", "host", "port", "database"}
	if len(p) > 0 && p[0] == '/' {
		db, query, hasQuery := strings.Cut(p[1:], "?")
		if _, err := uriDecode(db); err != nil {
			return fail("its database name is not percent-encoded as a URL's must be")
		}
		out.WriteString("/" + db)
		p = ""
		if hasQuery {
			p = "?" + query
		}
	}
	if len(p) > 0 && p[0] == '?' {
		var kept []string
		params := p[1:]
		for params != "" {
			pair := params
			if i := strings.IndexByte(params, '&'); i >= 0 {
				pair, params = params[:i], params[i+1:]
			} else {
				params = ""
			}
			rawKey, rawValue, found := strings.Cut(pair, "=")
			if !found || strings.IndexByte(rawValue, '=') >= 0 {
				return fail(`a query parameter has no "=" or more than one`)
			}
			key, err := uriDecode(rawKey)
			if err != nil {
				return fail("a query parameter's key is not percent-encoded as a URL's must be")
			}
			value, err := uriDecode(rawValue)
			if err != nil {
				return fail("a query parameter's value is not percent-encoded as a URL's must be")
			}
			key = connKey(key)
			if isSecretKey(key) {
				r.secrets = append(r.secrets, rawValue, value)
				r.stripped = true
				continue
			}
			kept = append(kept, pair)
			r.keys = append(r.keys, key)
		}
		if len(kept) > 0 {
			out.WriteString("?" + strings.Join(kept, "&"))
		}
	}
	r.dsn = out.String()
	return r
}

// uriDecode percent-decodes a URI component as libpq (and pgconn's
// uriDecode) does: %XX with two hex digits, %00 refused, leading and
// trailing spaces skipped, other spaces refused.
func uriDecode(raw string) (string, error) {
	t := strings.Trim(raw, " ")
	if strings.IndexByte(t, ' ') >= 0 {
		return "", errors.New("space")
	}
	var b strings.Builder
	for i := 0; i < len(t); i++ {
		if t[i] != '%' {
			b.WriteByte(t[i])
			continue
		}
		if i+2 >= len(t) || !isHex(t[i+1]) || !isHex(t[i+2]) {
			return "", errors.New("bad escape")
		}
		c := unhex(t[i+1])<<4 | unhex(t[i+2])
		if c == 0 {
			return "", errors.New("%00")
		}
		b.WriteByte(c)
		i += 2
	}
	return b.String(), nil
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	}
	return c - 'a' + 10
}

// kvSpace is the whitespace of libpq's keyword/value tokenizer.
const kvSpace = " \t\n\r\v\f"

// stripKeywordValue mirrors pgconn's parseKeywordValueSettings (libpq's
// conninfo tokenizer): a key runs to the first '=', a quoted value to the
// first unescaped quote, an unquoted one to the first unescaped blank; '\'
// escapes any character; nothing need separate a closing quote from the
// next key. It cuts each secret pair out, from its key to the next key, so
// that what is kept is left exactly as written.
func stripKeywordValue(s string) (r strippedDSN) {
	fail := func(msg string) strippedDSN {
		r.err = errors.New(msg)
		return r
	}
	rest := strings.TrimLeft(s, kvSpace)
	var out strings.Builder
	for len(rest) > 0 {
		pairStart := rest
		eq := strings.IndexByte(rest, '=')
		if eq < 0 {
			return fail(`it has a keyword without "="`)
		}
		key := strings.Trim(rest[:eq], kvSpace)
		if key == "" || strings.ContainsAny(key, kvSpace) {
			return fail("it has an empty keyword or one holding a blank")
		}
		v := strings.TrimLeft(rest[eq+1:], kvSpace)
		var raw string
		switch {
		case len(v) == 0:
			rest = v
		case v[0] != '\'':
			end := 0
			for ; end < len(v); end++ {
				if strings.IndexByte(kvSpace, v[end]) >= 0 {
					break
				}
				if v[end] == '\\' {
					end++
					if end == len(v) {
						break
					}
				}
			}
			raw = v[:end]
			rest = strings.TrimLeft(v[end:], kvSpace)
		default:
			q := v[1:]
			end := 0
			for ; end < len(q); end++ {
				if q[end] == '\'' {
					break
				}
				if q[end] == '\\' {
					end++
					if end == len(q) {
						break
					}
				}
			}
			if end >= len(q) {
				return fail("it has an unterminated quoted value")
			}
			raw = q[:end]
			rest = strings.TrimLeft(q[end+1:], kvSpace)
		}
		key = connKey(key)
		if isSecretKey(key) {
			r.secrets = append(r.secrets, raw, unescapeKeywordValue(raw))
			r.stripped = true
			continue
		}
		out.WriteString(pairStart[:len(pairStart)-len(rest)])
		r.keys = append(r.keys, key)
	}
	r.dsn = strings.TrimRight(out.String(), kvSpace)
	return r
}

// unescapeKeywordValue drops each '\' and keeps what it escapes.
func unescapeKeywordValue(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' {
			i++
			if i == len(s) {
				break
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// checkNoSecretKey asks pgx whether connString still holds a password or
// sslpassword, from its own parse of the string alone (ConnStringAllowedKeys
// is checked before the environment, a service file or a passfile is read,
// so PGPASSWORD and ~/.pgpass cannot stand in for one): every key the
// stripping kept is allowed, never password or sslpassword, and a key pgx
// refuses fails the check. keys only spare false refusals; they cannot make
// pgx accept a password.
func checkNoSecretKey(connString string, keys []string) error {
	if connString == "" {
		return nil
	}
	// No key allowed: a refused key proves pgx parsed the string (the check
	// comes after the parse); any other error is a string pgx cannot read.
	_, err := pgconn.ParseConfigWithOptions(connString, pgconn.ParseConfigOptions{ConnStringAllowedKeys: []string{}})
	if err == nil {
		return nil // no key at all
	}
	if !keyRefused(err) {
		return errors.New("refusing to write the template: DATABASE_URL without its password is not a connection string pgx reads")
	}
	allowed := []string{}
	for _, k := range keys {
		if !isSecretKey(k) {
			allowed = append(allowed, k)
		}
	}
	_, err = pgconn.ParseConfigWithOptions(connString, pgconn.ParseConfigOptions{ConnStringAllowedKeys: allowed})
	if err != nil && keyRefused(err) {
		return errors.New("refusing to write the template: pgx still reads a password (or sslpassword, or a key lambdalocal cannot vouch for) in DATABASE_URL after stripping it; remove it from DATABASE_URL and give PGPASSWORD at invoke time")
	}
	// Any other error comes after the key check (a file, a port): not a
	// password.
	return nil
}

// checkURLShape refuses two ways of writing DATABASE_URL that neither pgx nor
// the stripping reads as a URL with a password, though one is in it: a
// scheme not in lower case (Postgresql://u:pw@h/db is read as a keyword/value
// string, whose first key is all of it), and an '@' after the first '/'
// past the scheme (postgres://u:pw/x@h/db: libpq ends the user at the '/',
// and reads "u:pw" as a host). Either would carry the password into the
// template whole.
func checkURLShape(dsn string) error {
	lower := strings.ToLower(dsn)
	for _, scheme := range []string{"postgres://", "postgresql://"} {
		if !strings.HasPrefix(lower, scheme) {
			continue
		}
		if !strings.HasPrefix(dsn, scheme) {
			return errors.New("refusing to write the template: DATABASE_URL's scheme must be postgres:// or postgresql://, in lower case (pgx reads another case as no URL at all)")
		}
		rest := dsn[len(scheme):]
		if i := strings.IndexByte(rest, '/'); i >= 0 && strings.Contains(rest[i:], "@") {
			return errors.New("refusing to write the template: DATABASE_URL has an '@' after a '/': percent-encode a '/' in its user or password (%2F), or a '@' in its database name or options (%40)")
		}
	}
	return nil
}

// keyRefused reports whether err is pgx refusing a key under
// ConnStringAllowedKeys.
func keyRefused(err error) bool {
	var pce *pgconn.ParseConfigError
	return errors.As(err, &pce) && pce.Unwrap() == nil && strings.HasSuffix(pce.Error(), " is not in ConnStringAllowedKeys")
}

// originalSecrets lists the secrets of the original DATABASE_URL: those the
// stripping found, and the password pgx reads from the string itself (one
// the stripped string does not give as well: that comes from PGPASSWORD or
// the passfile, not from DATABASE_URL).
func originalSecrets(original string, dsn strippedDSN) []string {
	secrets := dsn.secrets
	if cfg, err := pgconn.ParseConfig(strings.TrimSpace(original)); err == nil && cfg.Password != "" {
		if env, err := pgconn.ParseConfig(dsn.dsn); err != nil || env.Password != cfg.Password {
			secrets = append(secrets, cfg.Password)
		}
	}
	return secrets
}

// containsSecret reports whether b holds any secret of at least 4 bytes,
// raw, query-escaped or path-escaped, as is or JSON-escaped.
func containsSecret(b []byte, secrets []string) bool {
	for _, s := range secrets {
		if len(s) < 4 {
			continue
		}
		for _, form := range []string{s, url.QueryEscape(s), url.PathEscape(s)} {
			if bytes.Contains(b, []byte(form)) {
				return true
			}
			if j, err := json.Marshal(form); err == nil && bytes.Contains(b, j[1:len(j)-1]) {
				return true
			}
		}
	}
	return false
}

// maxSyncPayload is the largest event Lambda accepts for a synchronous
// invocation (6 MB); the emulator cuts a longer one short.
const maxSyncPayload = 6 << 20

// functionTimeoutVar is the emulator's setting of the function's timeout,
// in whole seconds; emulator.Start sets 120 unless the environment given
// to it does.
const functionTimeoutVar = "AWS_LAMBDA_FUNCTION_TIMEOUT"

// migrateTimeout is the timeout the stack gives the migrate function.
const migrateTimeout = 15 * time.Minute

// deployedTimeout returns the timeout the stack gives function for this
// shell's settings; known is false for a name this command does not know.
func deployedTimeout(function string) (d time.Duration, known bool, err error) {
	if function == "migrate" {
		return migrateTimeout, true, nil
	}
	for _, f := range samFunctions {
		if f.dir == function {
			shell, err := shellSettings("the invoked function")
			if err != nil {
				return 0, true, err
			}
			d, err := samTimeout(shell, f.dir)
			return d, true, err
		}
	}
	return 0, false, nil
}

// invokeTimeout returns the function's timeout, in whole seconds, for the
// emulator: -timeout when given (set), else AWS_LAMBDA_FUNCTION_TIMEOUT
// from the shell (shellValue, checked), else the deployed function's for
// this shell's settings, so that a run stops where a deployed one does (the
// sweep's deadline margin counts from it); "" for a function this command
// does not know, which gets the emulator's 120 s.
func invokeTimeout(set bool, flagValue time.Duration, shellValue, function string) (string, error) {
	var d time.Duration
	switch {
	case set:
		if flagValue < time.Second || flagValue > samMaxTimeout || flagValue%time.Second != 0 {
			return "", fmt.Errorf("-timeout %s: want whole seconds from 1s to %s, as Lambda takes", flagValue, samMaxTimeout)
		}
		d = flagValue
	case shellValue != "":
		n, err := strconv.Atoi(shellValue)
		if err != nil || n < 1 || n > int(samMaxTimeout/time.Second) {
			return "", fmt.Errorf("%s=%q: want whole seconds from 1 to %d, as Lambda takes", functionTimeoutVar, shellValue, int(samMaxTimeout/time.Second))
		}
		return shellValue, nil
	default:
		var known bool
		var err error
		if d, known, err = deployedTimeout(function); err != nil || !known {
			return "", err
		}
	}
	return strconv.Itoa(int(d / time.Second)), nil
}

// samFunctions are the functions of the SAM template, with the timeouts the
// deployed stack gives them by default (infra/stack: the sweep's is its
// 5-minute interval less one minute; the partition manager's 5 minutes), so
// that a local run stops where a deployed one does (the sweep's deadline
// margin counts from its timeout). samTimeouts lengthens the first two as
// the shell's settings need.
var samFunctions = []struct {
	logicalID, dir string
	timeout        time.Duration
}{
	{"SweepFunction", "sweep", 4 * time.Minute},
	{"PartitionsFunction", "partitions", 5 * time.Minute},
	{"LookupFunction", "lookup", 10 * time.Second},
}

// Timeouts the stack also keeps (infra/stack): a sweep has at least
// samSweepWindow of its timeout to start batches in after its deadline
// margin, and a partitions run samPartitionsSlack beyond its longest DDL
// statement, within Lambda's 15 minutes.
const (
	samSweepWindow     = 10 * time.Second
	samPartitionsSlack = 2 * time.Minute
	samMaxTimeout      = 15 * time.Minute
)

// samTimeouts returns each function's timeout for the shell's settings s:
// a sweep whose deadline margin (SWEEP_DEADLINE_MARGIN, or its statement
// timeout plus 5 s) left it no time would fail every run with "started no
// batch", and a partitions run shorter than one DDL statement would be cut
// off midway. Settings no Lambda timeout can hold are refused.
func samTimeouts(s settings.Settings) (map[string]time.Duration, error) {
	out := map[string]time.Duration{}
	for _, f := range samFunctions {
		d, err := samTimeout(s, f.dir)
		if err != nil {
			return nil, err
		}
		out[f.dir] = d
	}
	return out, nil
}

// samTimeout is samTimeouts for the function in directory dir alone, whose
// timeout another function's settings do not change.
func samTimeout(s settings.Settings, dir string) (time.Duration, error) {
	var d time.Duration
	for _, f := range samFunctions {
		if f.dir == dir {
			d = f.timeout
		}
	}
	switch dir {
	case "sweep":
		margin := s.Sweep.WithDefaults().DeadlineMargin
		if d = max(d, margin+samSweepWindow); d > samMaxTimeout {
			return 0, fmt.Errorf("the sweep's deadline margin (%s: SWEEP_DEADLINE_MARGIN, by default SWEEP_STATEMENT_TIMEOUT + 5s) leaves no Lambda timeout %s to start batches in: shorten it", margin, samSweepWindow)
		}
	case "partitions":
		p := s.Partitions.WithDefaults()
		longest := max(p.StatementTimeout, p.LockTimeout)
		if d = max(d, longest+samPartitionsSlack); d > samMaxTimeout {
			return 0, fmt.Errorf("PARTITION_STATEMENT_TIMEOUT or PARTITION_LOCK_TIMEOUT (%s) leaves no Lambda timeout %s beyond it: shorten it", longest, samPartitionsSlack)
		}
	}
	if r := d % time.Second; r != 0 {
		d += time.Second - r // whole seconds (Lambda's unit), up
	}
	return d, nil
}

// shellSettings reads this shell's timeouts with the functions' own rules,
// alone: the rest of the shell's settings are checked where they are used.
// who names what gets them, for the error.
func shellSettings(who string) (settings.Settings, error) {
	shell, err := settings.FromEnv(func(name string) string {
		switch name {
		case "SWEEP_STATEMENT_TIMEOUT", "SWEEP_LOCK_TIMEOUT", "SWEEP_DEADLINE_MARGIN", "PARTITION_STATEMENT_TIMEOUT", "PARTITION_LOCK_TIMEOUT":
			return os.Getenv(name)
		case "DATABASE_URL":
			return "postgres://localhost/timeouts-only"
		}
		return ""
	})
	if err != nil {
		return shell, fmt.Errorf("this shell's timeouts, given to %s: %s", who, settings.Redact(err.Error()))
	}
	return shell, nil
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
	original, hasURL := env["DATABASE_URL"]
	var dsn strippedDSN
	if hasURL {
		dsn = stripSecrets(original)
		env["DATABASE_URL"] = dsn.dsn // trimmed, as settings reads it
		if dsn.err != nil {
			fmt.Fprintf(stderr, "lambdalocal: DATABASE_URL is not a connection string pgx reads (%v): the template gets none of it\n", dsn.err)
		}
	}
	if dsn.stripped {
		env["PGPASSWORD"], env["PGSSLPASSWORD"] = "", ""
		fmt.Fprintln(stderr, `lambdalocal: the password in DATABASE_URL was left out of the template; give it at invoke time:`)
		fmt.Fprintln(stderr, `  echo '{"Parameters": {"PGPASSWORD": "..."}}' > bin/sam/env.json  # keep it out of version control`)
		fmt.Fprintln(stderr, `  sam local invoke -t bin/sam/template.json --env-vars bin/sam/env.json LookupFunction -e events/lookup-direct.json`)
	}
	if hasURL {
		if err := checkURLShape(strings.TrimSpace(original)); err != nil {
			return err
		}
		// The last guard, which does not trust the stripping: pgx itself
		// must find no password in what goes into the template.
		if err := checkNoSecretKey(dsn.dsn, dsn.keys); err != nil {
			return err
		}
		// A password encoded together with the user name
		// (urlencode(user + ":" + password), user=app:pw) is no password
		// key to strip: the functions refuse such a string
		// (database.Config), and the template must not carry it.
		if cc, err := pgconn.ParseConfig(dsn.dsn); err == nil && strings.ContainsRune(cc.User, ':') {
			return errors.New("refusing to write the template: DATABASE_URL's user name holds ':' (a password encoded together with it?): give user and password apart, user:password@host, each percent-encoded on its own")
		}
	}
	shell, err := shellSettings("the template's functions")
	if err != nil {
		return err
	}
	timeouts, err := samTimeouts(shell)
	if err != nil {
		return err
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
				"Timeout":       int(timeouts[f.dir] / time.Second),
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
	// A password that is also ordinary text of the kept DATABASE_URL
	// (postgres://postgres@localhost/app with password "postgres", a
	// password equal to the user or database name) says nothing by being
	// found there: pgx's key check above is the guard for it.
	var secrets []string
	for _, secret := range originalSecrets(original, dsn) {
		if !containsSecret([]byte(dsn.dsn), []string{secret}) {
			secrets = append(secrets, secret)
		}
	}
	if hasURL && containsSecret(b, secrets) {
		return errors.New("refusing to write the template: it would hold the password of DATABASE_URL; remove password and sslpassword from DATABASE_URL and give PGPASSWORD at invoke time")
	}
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
		return err
	}
	return os.WriteFile(*out, append(b, '\n'), 0o644)
}

// functionEnv picks from environ (KEY=value pairs) what a function invoked
// here is given: the project's settings, and the variables pgx (PG*:
// PGPASSWORD, PGSSLMODE, ...) and the AWS SDK (AWS_*: the region and
// credentials a secret or an IAM token needs) read, as a deployed function
// has them. Nothing else of the shell's environment reaches it. (A template,
// a file that gets shared, takes the settings alone.)
// xrayDaemonAddress is the variable the X-Ray SDK reads its daemon's
// address from when its package initializes, in every binary that links it
// (the functions, unless built with the notrace tag): one it cannot parse
// or resolve panics the function before main.
const xrayDaemonAddress = "AWS_XRAY_DAEMON_ADDRESS"

// checkXRayDaemonAddress refuses a daemon address (the value of
// AWS_XRAY_DAEMON_ADDRESS in this process's environment, which the invoked
// function gets) that the X-Ray SDK would panic on in the function: read by
// the SDK's own parser, which is stricter than net's (no IPv6 literal, a
// single space between the two forms, a numeric port), and resolved.
func checkXRayDaemonAddress(v string) error {
	if v == "" {
		return nil
	}
	if _, err := daemoncfg.GetDaemonEndpointsFromEnv(); err != nil {
		return fmt.Errorf("%s=%q: %v (the function's X-Ray SDK would panic at start): give host:port, or unset it", xrayDaemonAddress, v, err)
	}
	return nil
}

func functionEnv(environ []string) map[string]string {
	env := map[string]string{}
	for _, kv := range environ {
		name, val, ok := strings.Cut(kv, "=")
		if !ok {
			continue
		}
		if strings.HasPrefix(name, "PG") || strings.HasPrefix(name, "AWS_") || slices.ContainsFunc(settings.Variables, func(v settings.Variable) bool { return v.Name == name }) {
			env[name] = val
		}
	}
	return env
}
