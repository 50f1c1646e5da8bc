package database

import (
	"encoding/hex"
	"errors"
	"net/netip"
	"net/url"
	"strings"
	"unicode"

	"github.com/jackc/pgx/v5/pgconn"
)

// errAmbiguousURL is the one message for a connection string whose parts
// cannot be told apart with certainty. pgx, like libpq, ends the user and
// password at the first '@' before any '/' (even one inside what looks like
// a query), so an unescaped '@' or '/' in a password moves the rest of it
// into the host or the database name, where errors, logs and DNS lookups
// would carry it. The message therefore echoes nothing of the string.
//
// A URL is refused as ambiguous when (the invariant: whatever pgx reads as
// host or database holds nothing of the user name or password):
//   - what pgx takes for the user name and password holds a '?' or '#': the
//     '@' that ended it was inside a query (a password=...@... parameter of
//     a URL without a path), and what follows it is the password's tail;
//   - the raw path holds an '@': a '/' in the password ended the authority;
//   - a host pgx parsed is not a plausible host name (PoolConfig): an '@' in
//     the password left its tail in front of the real host.
//
// An '@' in a query value after the user name, or a percent-encoded '@' in
// the database name, is not ambiguous and is accepted.
var errAmbiguousURL = errors.New("database URL is ambiguous (its host or database name would hold part of the user name or password): percent-encode @ / : ? # in the user name and password as %40 %2F %3A %3F %23")

// settingsNamed reports which settings a connection string names itself, by
// canonical key ("host", "hostaddr", "port", "database", "sslmode", "ssl",
// "sslrootcert", ...), as pgx would read them: in a URL the netloc, the path
// and the query; in keyword/value form the keywords. hasQuery reports a URL
// with a query part. It reads structure only; pgx parses the values.
type settingsNamed struct {
	keys     map[string]bool
	isURL    bool
	hasQuery bool
}

func (n settingsNamed) host() bool     { return n.keys["host"] || n.keys["hostaddr"] }
func (n settingsNamed) port() bool     { return n.keys["port"] }
func (n settingsNamed) database() bool { return n.keys["database"] }
func (n settingsNamed) sslmode() bool  { return n.keys["sslmode"] || n.keys["ssl"] }

func isURL(connString string) bool {
	return strings.HasPrefix(connString, "postgres://") || strings.HasPrefix(connString, "postgresql://")
}

// namedSettings scans connString the way pgx's parsers do (which follow
// libpq) and reports the settings it names. A URL whose authority holds more
// than one '@' is refused with errAmbiguousURL.
func namedSettings(connString string) (settingsNamed, error) {
	n := settingsNamed{keys: map[string]bool{}}
	if !isURL(connString) {
		return n, scanKeywords(connString, n.keys)
	}
	n.isURL = true
	p, ok := strings.CutPrefix(connString, "postgresql://")
	if !ok {
		p, _ = strings.CutPrefix(connString, "postgres://")
	}
	if i := strings.IndexAny(p, "@/"); i >= 0 && p[i] == '@' {
		if strings.ContainsAny(p[:i], "?#") {
			return n, errAmbiguousURL
		}
		p = p[i+1:]
	}
	end := strings.IndexAny(p, "/?")
	if end < 0 {
		end = len(p)
	}
	for _, spec := range strings.Split(p[:end], ",") {
		host, port := spec, ""
		if strings.HasPrefix(spec, "[") {
			if i := strings.IndexByte(spec, ']'); i >= 0 {
				host, port = spec[:i+1], strings.TrimPrefix(spec[i+1:], ":")
			}
		} else if i := strings.IndexByte(spec, ':'); i >= 0 {
			host, port = spec[:i], spec[i+1:]
		}
		if strings.TrimSpace(host) != "" {
			n.keys["host"] = true
		}
		if strings.TrimSpace(port) != "" {
			n.keys["port"] = true
		}
	}
	p = p[end:]
	if rest, ok := strings.CutPrefix(p, "/"); ok {
		db := rest
		p = ""
		if i := strings.IndexByte(rest, '?'); i >= 0 {
			db, p = rest[:i], rest[i:]
		}
		if strings.IndexByte(db, '@') >= 0 {
			return n, errAmbiguousURL
		}
		if db != "" {
			n.keys["database"] = true
		}
	}
	if query, ok := strings.CutPrefix(p, "?"); ok {
		n.hasQuery = true
		for _, pair := range strings.Split(query, "&") {
			key, _, _ := strings.Cut(pair, "=")
			n.keys[canonicalKey(percentDecode(strings.TrimSpace(key)))] = true
		}
	}
	return n, nil
}

// scanKeywords records the keywords of a keyword/value connection string,
// skipping values (quoted or not, with backslash escapes) as pgx does.
func scanKeywords(s string, keys map[string]bool) error {
	const space = " \t\n\r\v\f"
	s = strings.TrimLeft(s, space)
	for s != "" {
		eq := strings.IndexByte(s, '=')
		if eq < 0 {
			return errors.New("database URL is not a valid PostgreSQL connection string")
		}
		key := strings.Trim(s[:eq], space)
		if !keyword(key) {
			// Not a keyword (a JDBC URL, "postgresql+psycopg2://..."):
			// pgx would send it and its value, which may be a password,
			// to the server as a setting. The key is not echoed.
			return errors.New("database URL is neither a postgres:// URL nor keyword=value pairs")
		}
		keys[canonicalKey(key)] = true
		s = strings.TrimLeft(s[eq+1:], space)
		quoted := strings.HasPrefix(s, "'")
		if quoted {
			s = s[1:]
		}
		end := 0
		for ; end < len(s); end++ {
			if s[end] == '\\' {
				end++
				continue
			}
			if (quoted && s[end] == '\'') || (!quoted && strings.IndexByte(space, s[end]) >= 0) {
				break
			}
		}
		if quoted {
			end++ // the closing quote
		}
		s = strings.TrimLeft(s[min(end, len(s)):], space)
	}
	return nil
}

// keyword reports whether k can be a connection keyword, or a setting pgx
// passes on as a runtime parameter: letters (any script, as PostgreSQL
// takes in a name), digits, '_', '$' and, in a custom setting's name, '.'.
// Another dialect's string holds ':', '/', ';' or '+' in what would be its
// first keyword.
func keyword(k string) bool {
	if k == "" {
		return false
	}
	for _, r := range k {
		if !unicode.IsLetter(r) && !unicode.IsDigit(r) && r != '_' && r != '$' && r != '.' {
			return false
		}
	}
	return true
}

func canonicalKey(k string) string {
	if k == "dbname" {
		return "database"
	}
	return k
}

// percentDecode decodes %XX sequences; anything malformed is left for pgx's
// parser to refuse.
func percentDecode(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) {
			if v, err := hex.DecodeString(s[i+1 : i+3]); err == nil {
				b.WriteByte(v[0])
				i += 2
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// secretPlaceholderHost stands for the secret's host until the first
// connection fetches it. It is not local, so the TLS rule applies to it.
const secretPlaceholderHost = "secret.invalid"

// withSecretHost returns connString naming the placeholder host, and
// sslmode=verify-full unless it names an sslmode itself, for a connection
// whose host comes from the secret. Nothing already in connString changes:
// a keyword/value string gets the settings in front (a later keyword wins),
// a URL gets them appended to its query, where pgx reads them last, and only
// those it does not name.
func withSecretHost(connString string, n settingsNamed) string {
	if connString == "" {
		return "host=" + secretPlaceholderHost + " sslmode=verify-full"
	}
	if !n.isURL {
		return "host=" + secretPlaceholderHost + " sslmode=verify-full " + connString
	}
	add := "host=" + secretPlaceholderHost
	if !n.sslmode() {
		add += "&sslmode=verify-full"
	}
	switch {
	case !n.hasQuery:
		return connString + "?" + add
	case strings.HasSuffix(connString, "?"), strings.HasSuffix(connString, "&"):
		return connString + add
	}
	return connString + "&" + add
}

// plausibleHost reports whether host can be a host at all: a Unix socket
// directory, an IP address, or a DNS name. A host parsed out of a URL with an
// unescaped '@' in its password is none of these, and is never printed.
func plausibleHost(host string) bool {
	switch {
	case host == "" || len(host) > 253:
		return false
	case strings.HasPrefix(host, "/"):
		return true
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return true
	}
	for _, c := range []byte(host) {
		ok := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_'
		if !ok {
			return false
		}
	}
	return true
}

// WithSearchPath returns connString (a URL or keyword/value string) with
// its search_path set to searchPath (the setting's value, as SET would take
// it), for tools and tests that work in a schema of their own. The setting
// is appended, where pgx reads it last, so nothing else in connString is
// re-encoded (a password Go's net/url cannot read stays as pgx reads it),
// and pgx's reading of the result is checked. Its errors never hold the
// connection string.
func WithSearchPath(connString, searchPath string) (string, error) {
	n, err := namedSettings(connString)
	if err != nil {
		return "", err
	}
	out := connString + " search_path='" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(searchPath) + "'"
	if n.isURL {
		sep := "&"
		switch {
		case !n.hasQuery:
			sep = "?"
		case strings.HasSuffix(connString, "?"), strings.HasSuffix(connString, "&"):
			sep = ""
		}
		out = connString + sep + "search_path=" + strings.ReplaceAll(url.QueryEscape(searchPath), "+", "%20")
	}
	cfg, err := pgconn.ParseConfig(out)
	if err != nil {
		return "", errors.New("the database connection string cannot be read (not shown: it may hold a password)")
	}
	if got := cfg.RuntimeParams["search_path"]; got != searchPath {
		return "", errors.New("could not set search_path on the database connection string (not shown: it may hold a password)")
	}
	return out, nil
}
