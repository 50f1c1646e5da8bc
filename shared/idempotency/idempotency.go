// Package idempotency is net/http middleware that follows the IETF
// Idempotency-Key draft and adds what no other implementation does: a retry
// that arrives after the key's live window is answered from the permanent
// archive with a definite 409 idempotency_key_expired, carrying the original
// status and resource id, instead of running the operation a second time.
//
//	mw, err := idempotency.New(idempotency.Config{
//		Store:   livestore.NewPostgres(pool),
//		Archive: archiveReader,              // *archive.Reader, or archiveclient.Lambda
//		LiveTTL: 24 * time.Hour,
//		// How far ahead of the store's clock a key's timestamp may lie.
//		ClockSkew: keytime.DefaultClockSkew,
//		// Scope keys to the authenticated caller (set by your auth middleware).
//		Tenant: func(r *http.Request) string { return auth.AccountID(r.Context()) },
//	})
//	http.Handle("POST /v1/charges", mw.Wrap(chargesHandler))
//
// # Keys
//
// The key comes from the Idempotency-Key header: 1 to 255 bytes of printable
// text (no control characters). A missing key is a 400 when Config.Required.
// The scoped key stored and archived is "idem:v1t:" + escaped tenant + ":" +
// key, where Config.Tenant names the authenticated caller's tenant, or
// "idem:v1:" + key for a service configured with Config.SingleTenant; the
// tenant is percent-encoded so that it never contains ':' and two tenants'
// keys can never collide. With SingleTenant the header "Idempotency-Key:
// probe" is the scoped key "idem:v1:probe".
//
// # Fingerprint
//
// SHA-256 over exactly these bytes: the method, "\n", the request target as
// sent (the escaped path, then "?" and the raw query string when there is
// one), "\n", and the raw request body. "POST /v1/refunds?charge=ch_1" with
// body {"amount":100} hashes "POST\n/v1/refunds?charge=ch_1\n{\"amount\":100}".
// The query is taken byte for byte: the same parameters in another order or
// encoding are a different request. Requests without a query hash as they
// did before the query was covered.
//
// # Flow
//
// The middleware registers the key in the live store. A completed key with the
// same fingerprint replays the stored status and body with the header
// Idempotent-Replayed: true; a different fingerprint is a 422; a key still in
// flight is a 409 with Retry-After. A fresh key is checked against the archive
// unless the store proves that no earlier life of it can be there yet (see
// package keytime for the invariant): if the archive holds it, the
// registration is undone and the answer is 409 idempotency_key_expired (or 422
// when the archived fingerprint differs). Otherwise the handler runs; its
// status, body and resource id are recorded on completion. A handler that
// answers 5xx or panics releases the key, so the client may retry.
//
// A key whose timestamp (ULID, UUIDv7) lies further ahead of the store's
// clock than Config.ClockSkew is not registered: it is looked up in the whole
// archive and answered from it when found, and is otherwise a 400
// idempotency_key_timestamp_ahead, so that every stored key keeps the bound
// that the skip and the archive's partition pruning rely on. When the archive
// cannot be reached such a key is a 503, even with FailOpen: it is never
// refused or run unchecked.
package idempotency

import (
	"bytes"
	"cmp"
	"compress/gzip"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/keytime"
	"github.com/idemarchive/idemarchive/shared/metrics"
	"github.com/idemarchive/idemarchive/shared/problem"
	"github.com/idemarchive/idemarchive/shared/resourceid"
)

// Header names.
const (
	HeaderKey      = "Idempotency-Key"
	HeaderReplayed = "Idempotent-Replayed"
	// HeaderTTL publishes the live window, in seconds, on every response to a
	// request that carried a key.
	HeaderTTL = "Idempotency-Key-TTL"
)

// MaxKeyBytes bounds the client's key.
const MaxKeyBytes = 255

// MaxScopedKeyBytes bounds the middleware's scoped keys (the tenant scope
// and the client's key together), well within what the archive holds
// (archive.MaxScopedKeyBytes).
const MaxScopedKeyBytes = 512

// State of a live entry.
type State int

// States.
const (
	InFlight State = iota
	Completed
)

// Entry is a key's live record.
type Entry struct {
	Fingerprint []byte
	State       State
	Status      int
	Body        []byte
	ContentType string
	ResourceID  *string
	CreatedAt   time.Time
	ExpiresAt   time.Time
	// BodyIsJSONB says Body is a response another writer stored as jsonb
	// (the Postgres store's response column), with no resource id
	// recorded: the sweeper archives the id at its JSON path.
	BodyIsJSONB bool
	// WindowEnded, when not nil, is the store's own verdict on whether
	// ExpiresAt has passed, by the clock that set it (the database's, for
	// the Postgres store). The middleware trusts it over its own clock,
	// which may run ahead (an in-flight request answered "expired, never
	// completed" while it runs) or behind.
	WindowEnded *bool
}

// windowEnded reports whether e's live window has ended: by the store's
// verdict when it gave one, else by the middleware's clock.
func (m *Middleware) windowEnded(e Entry) bool {
	if e.WindowEnded != nil {
		return *e.WindowEnded
	}
	return !e.ExpiresAt.IsZero() && !m.cfg.Now().Before(e.ExpiresAt)
}

// Completion is what the middleware records when a request completes.
type Completion struct {
	Fingerprint []byte
	// Token is the registration's token (Registering.Token): a store
	// completes only the entry registered with it.
	Token       []byte
	Status      int
	Body        []byte
	ContentType string
	ResourceID  *string
	// CreatedAt and ExpiresAt are the registration's times
	// (Registration.Entry): a store that archives at completion archives
	// the outcome with them even when its live entry was lost meanwhile.
	CreatedAt, ExpiresAt time.Time
}

// Registering is a request to register a key.
type Registering struct {
	// Key is the scoped key.
	Key         string
	Fingerprint []byte
	// Token tells this registration from any other of the same key and
	// fingerprint (the middleware draws 16 random bytes a request): Complete
	// and Release act only on the entry registered with it, so a request
	// whose registration landed but whose reply was lost can release its own
	// entry without ever freeing a concurrent duplicate's. Nil: no token,
	// matched as before (entries of older writers).
	Token []byte
	// TTL is the key's live window.
	TTL time.Duration
	// ClockSkew: a key whose timestamp lies further ahead of the store's
	// clock than this is refused (Registration.Ahead). 0 allows none.
	ClockSkew time.Duration
}

// Validate reports a TTL or clock skew no store may register under: a TTL
// under 1s or not whole milliseconds, a skew outside 0 to
// keytime.MaxClockSkew (the archive's pruning allows for no more). Stores
// check it, so that one used without the middleware keeps the bound too.
func (r Registering) Validate() error {
	if r.TTL < time.Second || r.TTL%time.Millisecond != 0 {
		return fmt.Errorf("live TTL must be at least 1s and a whole number of milliseconds, got %s", r.TTL)
	}
	return keytime.ValidateSkew(r.ClockSkew)
}

// Registration is the store's answer to Register.
type Registration struct {
	// Entry is the key's live entry: the new one when Fresh, else the
	// existing one. Empty when Ahead.
	Entry Entry
	// Fresh says this call created the entry.
	Fresh bool
	// Token is the registration token a fresh entry was stored with:
	// Registering.Token, or nil when the store could not keep one (a
	// database not migrated yet). Complete and Release of the entry take it.
	Token []byte
	// MayBeArchived says, for a fresh entry, that the archive can hold an
	// earlier life of the key, so the middleware must look it up. A store
	// that cannot prove otherwise says true.
	MayBeArchived bool
	// Ahead says the key's timestamp lies further ahead of the store's clock
	// than Registering.ClockSkew: nothing was registered.
	Ahead bool
}

// ErrNotInFlight is what a Store's Complete returns when it finds no
// in-flight entry with that fingerprint (it expired, was released, or a
// Complete whose reply was lost already completed it).
var ErrNotInFlight = errors.New("idempotency: key is not in flight")

// ErrNotSent is what a Store's Register error wraps when no registration of
// this request can be on the store: it ended before sending any (its
// context ended while it waited for a connection, or before). The
// middleware then answers at once, without a release that could match
// nothing.
var ErrNotSent = errors.New("idempotency: registration not sent")

// Store is a live store: Postgres (livestore.Postgres) or Redis (livestore.Redis).
type Store interface {
	// Register creates an in-flight entry for the key unless one exists or
	// the key's timestamp is ahead (see Registration). A store must never
	// store a key whose timestamp lies more than ClockSkew ahead of the
	// time it registers it: the archive's pruning relies on it.
	Register(ctx context.Context, req Registering) (Registration, error)
	// Complete records the outcome of the request that registered key, or
	// returns ErrNotInFlight.
	Complete(ctx context.Context, key string, c Completion) error
	// Release removes the in-flight entry this request registered: the one
	// of this fingerprint and registration token. With a token it matches
	// only an entry stored with that token; with nil, only one stored
	// without a token.
	Release(ctx context.Context, key string, fingerprint, token []byte) error
}

// BeforeRunReleaser is implemented by a store whose Release keeps an entry
// whose window has ended (livestore.Postgres: retries have been answered
// 409 expired since, and the entry gone, the next retry would run), and
// that can also free, whatever its window says, the entry of a request
// whose handler never started: nothing ran, so the retry its 503 asks for
// must run. The middleware uses it for those releases. A wrapper that hides
// it costs only that: such an entry is kept, and its retries are answered
// 409 expired.
type BeforeRunReleaser interface {
	ReleaseBeforeRun(ctx context.Context, key string, fingerprint, token []byte) error
}

// Archive answers whether an expired key ever existed: *archive.Reader (direct
// SQL) or archiveclient.Lambda (the lookup function). Lookup returns
// archive.ErrNotFound for a key it has never seen.
type Archive interface {
	Lookup(ctx context.Context, scopedKey string, fingerprint []byte) (archive.Record, error)
}

var _ Archive = (*archive.Reader)(nil)

// CompletionArchiver is implemented by a live store that writes a key's
// archive row when the key completes rather than when it expires
// (livestore.Redis). Such an archive can hold a key from the moment it
// completes, so when the live entry is lost (a failover, a restart, an
// eviction) the archive is the only record of it, however fresh the key's
// timestamp: the middleware never skips the archive lookup for such a store.
type CompletionArchiver interface {
	ArchivesAtCompletion() bool
}

// MinArchiveTimeout is the shortest ArchiveTimeout New accepts.
const MinArchiveTimeout = archive.MinLookupTimeout

// OnArchiveError says what to do when the archive cannot be reached.
type OnArchiveError int

const (
	// FailClosed answers 503 archive_unavailable with Retry-After (default):
	// a second charge is worse than a delayed one.
	FailClosed OnArchiveError = iota
	// FailOpen runs the handler as if the archive did not hold the key,
	// when the archive answers an error or is slow (ArchiveTimeout, the
	// Reader's own timeouts, a client's Timeout ended the lookup while the
	// request had time left): never when the request ended or ran out of
	// time during the lookup (its context ended, or its deadline, nearer
	// than ArchiveTimeout, bounded the lookup), nor on
	// archive.ErrMisconfigured, which are a 503.
	FailOpen
)

// Config configures the middleware.
type Config struct {
	// Store is the live store. Required.
	Store Store
	// Archive is consulted for fresh keys. Nil disables late-retry answers.
	Archive Archive
	// LiveTTL is how long a key stays live: at least 1s, whole milliseconds.
	// Default 24h.
	LiveTTL time.Duration
	// ClockSkew is how far ahead of the store's clock a key's timestamp
	// (ULID, UUIDv7) may lie; further ahead, the key is refused unless the
	// archive holds it. 0 to keytime.MaxClockSkew (1h), and 0 means none:
	// set keytime.DefaultClockSkew (5m) for the usual allowance.
	ClockSkew time.Duration
	// Required makes a request without a key a 400. Default false: such a
	// request passes through untouched.
	Required bool
	// UnquoteKeys reads a header value that begins with '"' as the IETF
	// draft's Structured Field String (ParseKey): "k" and k are then one
	// key, and a quoted ULID or UUIDv7 keeps its timestamp. Default false:
	// the key is the header value as written, quotes included, as in
	// releases before this setting. Turn it on for a new archive, or only
	// once no key a client sent quoted can still be retried: a key archived
	// as written ("k", quotes and all) is another key than k, and a late
	// retry of it would run again. For the same reason, never turn it off
	// once on.
	UnquoteKeys bool
	// Tenant returns the authenticated caller's tenant (an account id from
	// the verified credentials, never a header the client chooses freely).
	// Keys are scoped to it, so one caller can never replay, block or learn
	// another's response by sending its key and body. A request for which it
	// returns "" is a 401 idempotency_tenant_missing. Required unless
	// SingleTenant.
	Tenant func(*http.Request) string
	// SingleTenant scopes every key to the one service ("idem:v1:" + key):
	// all callers share one key space. Choose it only when every caller is
	// the same client or callers trust each other. Exactly one of Tenant and
	// SingleTenant must be set.
	SingleTenant bool
	// OnArchiveError: FailClosed (default) or FailOpen.
	OnArchiveError OnArchiveError
	// KeepServerErrors records a handler's 5xx like any other answer, and a
	// panic before any answer as a 500, so that no request whose handler
	// started ever runs again (Stripe's rule): for handlers that cannot
	// promise a 5xx means nothing happened. By default a 5xx, or a panic
	// before any answer, releases the key for a retry.
	KeepServerErrors bool
	// ArchiveTimeout bounds one archive lookup. Default 2s (when zero);
	// at least MinArchiveTimeout.
	ArchiveTimeout time.Duration
	// RetryAfter is sent with 409 in-flight and 503 answers. Default 1s,
	// also when zero: "Retry-After: 0" would have clients retry in a busy
	// loop, so zero is never meant.
	RetryAfter time.Duration
	// MaxBodyBytes bounds the request body read for the fingerprint; larger
	// bodies are a 413. Default 1 MiB, also when zero: a limit of 0 would
	// refuse every request with a body, the requests the middleware is for.
	MaxBodyBytes int64
	// ResourceIDPath is the dotted JSON path of the resource id in the
	// response body. Default "id".
	ResourceIDPath string
	// Metrics receives idempotency_expired_replay_total. May be nil.
	Metrics *metrics.Emitter
	// Logger receives store and archive errors. Default slog.Default().
	Logger *slog.Logger
	// Now returns the current time. Default time.Now.
	Now func() time.Time
}

// Middleware is the configured middleware.
type Middleware struct {
	cfg  Config
	path []string
	// archivesAtCompletion: the store writes archive rows at completion
	// (CompletionArchiver), so an archive row inside its window means a lost
	// live entry, not an expired one.
	archivesAtCompletion bool
}

// New validates cfg (after defaults) and returns the middleware.
func New(cfg Config) (*Middleware, error) {
	if cfg.Store == nil {
		return nil, errors.New("idempotency: a live store is required")
	}
	if nilPointer(cfg.Store) {
		return nil, fmt.Errorf("idempotency: Store is a nil %T", cfg.Store)
	}
	if (cfg.Tenant == nil) == !cfg.SingleTenant {
		return nil, errors.New("idempotency: set Config.Tenant to scope keys to the authenticated caller, or Config.SingleTenant when every caller shares one key space (exactly one of them)")
	}
	cfg.LiveTTL = cmp.Or(cfg.LiveTTL, 24*time.Hour)
	cfg.ArchiveTimeout = cmp.Or(cfg.ArchiveTimeout, 2*time.Second)
	cfg.RetryAfter = cmp.Or(cfg.RetryAfter, time.Second)
	cfg.MaxBodyBytes = cmp.Or(cfg.MaxBodyBytes, 1<<20)
	cfg.ResourceIDPath = cmp.Or(cfg.ResourceIDPath, "id")
	switch {
	case cfg.ArchiveTimeout < MinArchiveTimeout:
		// Shorter, no lookup fits (the Reader keeps a margin before the
		// deadline), and under FailOpen every key would run unchecked.
		return nil, fmt.Errorf("idempotency: archive timeout must be at least %s, got %s", MinArchiveTimeout, cfg.ArchiveTimeout)
	case cfg.RetryAfter < 0:
		return nil, fmt.Errorf("idempotency: Retry-After must not be negative, got %s", cfg.RetryAfter)
	case cfg.MaxBodyBytes < 0:
		return nil, fmt.Errorf("idempotency: max body bytes must not be negative, got %d", cfg.MaxBodyBytes)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if err := (Registering{TTL: cfg.LiveTTL, ClockSkew: cfg.ClockSkew}).Validate(); err != nil {
		return nil, fmt.Errorf("idempotency: %w", err)
	}
	if limited, ok := storeAs[interface{ MaxTTL() time.Duration }](cfg.Store); ok && cfg.LiveTTL > limited.MaxTTL() {
		return nil, fmt.Errorf("idempotency: live TTL %s is longer than this store allows (%s)", cfg.LiveTTL, limited.MaxTTL())
	}
	path, err := resourceid.SplitPath(cfg.ResourceIDPath)
	if err != nil {
		return nil, fmt.Errorf("idempotency: %w", err)
	}
	if nilPointer(cfg.Archive) {
		return nil, fmt.Errorf("idempotency: Archive is a nil %T", cfg.Archive)
	}
	if v, ok := cfg.Archive.(interface{ Validate() error }); ok {
		// An archive that can never answer (archiveclient.Lambda without
		// a function, or with a negative Timeout) is refused here, not
		// found on the first late retry.
		if err := v.Validate(); err != nil {
			return nil, fmt.Errorf("idempotency: archive: %w", err)
		}
	}
	ca, ok := storeAs[CompletionArchiver](cfg.Store)
	archivesAtCompletion := ok && ca.ArchivesAtCompletion()
	if archivesAtCompletion && cfg.Archive == nil {
		// Its archive rows would be written and never read: a hash lost
		// (a failover, an eviction) or a retry after the window would run
		// again.
		return nil, errors.New("idempotency: this store writes archive rows at completion (livestore.Redis): set Config.Archive to read them")
	}
	return &Middleware{cfg: cfg, path: path, archivesAtCompletion: archivesAtCompletion}, nil
}

// nilPointer reports whether v is a nil pointer in a non-nil interface: a
// store or archive that would panic on its first request.
func nilPointer(v any) bool {
	rv := reflect.ValueOf(v)
	return v != nil && rv.Kind() == reflect.Pointer && rv.IsNil()
}

// Unwrapper is implemented by a store that wraps another (a metrics or
// tracing decorator): the middleware looks through it, as errors.As does
// through errors, for the optional interfaces of the store beneath
// (CompletionArchiver, BeforeRunReleaser, a TTL limit), which the wrapper's
// own method set hides. The middleware may then call the inner store's
// method directly (ReleaseBeforeRun), past the wrapper: a wrapper that
// changes what one of them says or does implements it itself. Unwrap must
// not panic, on a nil wrapper either: New calls it.
type Unwrapper interface {
	Unwrap() Store
}

// storeAs returns the first store in s's chain of wrappers (s, then
// what each Unwrap returns) that implements T.
func storeAs[T any](s Store) (T, bool) {
	for range 100 { // a chain that loops ends here
		if t, ok := s.(T); ok {
			return t, true
		}
		u, ok := s.(Unwrapper)
		if !ok {
			break
		}
		if s = u.Unwrap(); s == nil {
			break
		}
	}
	var zero T
	return zero, false
}

// ScopedKey returns the stored form of a client key (see the package doc).
func ScopedKey(tenant, key string) string {
	if tenant == "" {
		return "idem:v1:" + key
	}
	return "idem:v1t:" + escapeTenant(tenant) + ":" + key
}

// escapeTenant percent-encodes every byte but [A-Za-z0-9._~-], so that the
// result never contains ':' and maps tenants one to one.
func escapeTenant(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '~' || c == '-' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// ValidateKey reports whether a client key is acceptable.
//
// A key that begins or ends with a space is refused: HTTP/1.1 servers
// (net/textproto) strip the whitespace around a header value and HTTP/2
// servers hand it on as sent, so such a key would be one key over one
// protocol and another over the other, and a retry that reached the server
// over the other (a client falling back to HTTP/1.1, a proxy on one path
// only) would run again. (A tab is a control character, refused too.)
func ValidateKey(key string) error {
	switch {
	case key == "":
		return errors.New("the Idempotency-Key header is empty")
	case len(key) > MaxKeyBytes:
		return fmt.Errorf("the Idempotency-Key is longer than %d bytes", MaxKeyBytes)
	case !utf8.ValidString(key):
		return errors.New("the Idempotency-Key is not valid UTF-8")
	case strings.IndexFunc(key, unicode.IsControl) >= 0:
		return errors.New("the Idempotency-Key contains control characters")
	case key[0] == ' ' || key[len(key)-1] == ' ':
		// The answer does not invite sending the request again under the
		// trimmed key: that is another key, and would run the operation
		// again if the spaced one ever ran.
		return errors.New("the Idempotency-Key begins or ends with a space, which HTTP/1.1 drops and HTTP/2 keeps, so it is not one key on every path")
	}
	return nil
}

// ParseKey returns the client key an Idempotency-Key header value carries,
// or why it is refused, when Config.UnquoteKeys is on. The IETF draft
// defines the header as a Structured Field String (RFC 8941):
// "8e03978e-40d5-43e8-bc93-6894a57f9324", quotes included, '\' escaping '"'
// and '\'. Most clients send the key bare. A value that begins with '"' is
// read as a String and stands for its content, so that both forms of one
// key are the same key: a retry sent by a client, SDK or proxy that writes
// the other form is answered as a retry, never run as a new request, and a
// quoted ULID or UUIDv7 keeps its timestamp. A value that begins with '"'
// but is not a valid String is refused rather than taken as a bare key,
// which its retries in the valid form would not match. The content is then
// held to ValidateKey, as a bare key is.
func ParseKey(header string) (string, error) {
	if !strings.HasPrefix(header, `"`) {
		return header, ValidateKey(header)
	}
	if len(header) < 2 || !strings.HasSuffix(header, `"`) {
		return "", errors.New(`the Idempotency-Key begins with '"' but is not a quoted string: end it with '"'`)
	}
	var b strings.Builder
	inner := header[1 : len(header)-1]
	for i := 0; i < len(inner); i++ {
		c := inner[i]
		switch {
		case c == '\\':
			if i+1 == len(inner) || (inner[i+1] != '"' && inner[i+1] != '\\') {
				return "", errors.New(`the quoted Idempotency-Key has a '\' that escapes neither '"' nor '\'`)
			}
			i++
			b.WriteByte(inner[i])
		case c == '"':
			return "", errors.New(`the quoted Idempotency-Key has an unescaped '"' inside it`)
		case c < 0x20 || c > 0x7e:
			return "", errors.New("a quoted Idempotency-Key holds only printable ASCII characters")
		default:
			b.WriteByte(c)
		}
	}
	key := b.String()
	return key, ValidateKey(key)
}

// Fingerprint is SHA-256 over method, "\n", target, "\n", body, where
// target is RequestTarget of the request.
func Fingerprint(method, target string, body []byte) []byte {
	h := sha256.New()
	h.Write([]byte(method))
	h.Write([]byte{'\n'})
	h.Write([]byte(target))
	h.Write([]byte{'\n'})
	h.Write(body)
	return h.Sum(nil)
}

// RequestTarget is the part of the URL the fingerprint covers: the escaped
// path, and "?" plus the raw query when the query is not empty.
func RequestTarget(u *url.URL) string {
	if u.RawQuery == "" {
		return u.EscapedPath()
	}
	return u.EscapedPath() + "?" + u.RawQuery
}

// Wrap returns next behind the middleware.
func (m *Middleware) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		values, present := r.Header[http.CanonicalHeaderKey(HeaderKey)]
		if !present {
			if m.cfg.Required {
				m.problem(w, r, http.StatusBadRequest, "idempotency_key_missing", "this route requires an Idempotency-Key header", nil)
				return
			}
			next.ServeHTTP(w, r)
			return
		}
		w.Header().Set(HeaderTTL, strconv.FormatInt(int64(m.cfg.LiveTTL/time.Second), 10))
		if len(values) != 1 {
			m.problem(w, r, http.StatusBadRequest, "idempotency_key_invalid", "send exactly one Idempotency-Key header", nil)
			return
		}
		key, err := values[0], error(nil)
		if m.cfg.UnquoteKeys {
			key, err = ParseKey(key)
		} else {
			err = ValidateKey(key)
		}
		if err != nil {
			m.problem(w, r, http.StatusBadRequest, "idempotency_key_invalid", err.Error(), nil)
			return
		}
		if r.Body == nil {
			// A request built by hand (an adapter, a test) may have none;
			// a server's always has one.
			r.Body = http.NoBody
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, m.cfg.MaxBodyBytes))
		if err != nil {
			var tooLarge *http.MaxBytesError
			if errors.As(err, &tooLarge) {
				m.problem(w, r, http.StatusRequestEntityTooLarge, "body_too_large", fmt.Sprintf("the request body is larger than %d bytes", tooLarge.Limit), nil)
				return
			}
			m.problem(w, r, http.StatusBadRequest, "body_unreadable", "the request body could not be read", nil)
			return
		}
		tenant := ""
		if m.cfg.Tenant != nil {
			// A Tenant that reads the body (to check a signature over
			// it) reads a copy: the handler gets the whole body after it.
			r.Body = io.NopCloser(bytes.NewReader(body))
			if tenant = m.cfg.Tenant(r); tenant == "" {
				m.problem(w, r, http.StatusUnauthorized, "idempotency_tenant_missing", "this request has no authenticated caller to scope its Idempotency-Key to", nil)
				return
			}
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		scoped := ScopedKey(tenant, key)
		if len(scoped) > MaxScopedKeyBytes {
			m.problem(w, r, http.StatusBadRequest, "idempotency_key_invalid",
				fmt.Sprintf("the tenant scope and the key together exceed %d bytes", MaxScopedKeyBytes), nil)
			return
		}
		m.serve(w, r, next, scoped, Fingerprint(r.Method, RequestTarget(r.URL), body))
	})
}

func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler, scoped string, fp []byte) {
	ctx := r.Context()
	token := make([]byte, 16)
	_, _ = rand.Read(token) // never fails (crypto/rand)
	reg, err := m.cfg.Store.Register(ctx, Registering{Key: scoped, Fingerprint: fp, Token: token, TTL: m.cfg.LiveTTL, ClockSkew: m.cfg.ClockSkew})
	if err != nil {
		m.cfg.Logger.ErrorContext(ctx, "idempotency: live store register failed", "error", err)
		if !errors.Is(err, ErrNotSent) {
			// The registration may have landed and only its reply been
			// lost: release it, so that the retry this answer asks for
			// can run. The token makes this safe: only an entry
			// registered with it matches, never a concurrent duplicate's
			// (a store releases by a token only where it keeps tokens,
			// and never falls back to matching without one).
			m.release(ctx, scoped, fp, token)
		}
		m.retryAfter(w)
		m.problem(w, r, http.StatusServiceUnavailable, "idempotency_store_unavailable", "the idempotency store is unavailable; retry later", nil)
		return
	}
	// From here on the entry is released and completed by the token it was
	// stored with (nil: none was kept).
	token = reg.Token
	if reg.Ahead {
		m.ahead(w, r, scoped, fp)
		return
	}
	if !reg.Fresh {
		m.existing(w, r, scoped, reg.Entry, fp)
		return
	}
	if ctx.Err() != nil {
		// The request ended while it registered (a store waits for the
		// outcome of a registration it has sent, so that it is never left
		// behind unreleased): nobody is waiting for this answer, and the
		// handler must not start for it.
		m.release(ctx, scoped, fp, token)
		m.retryAfter(w)
		m.problem(w, r, http.StatusServiceUnavailable, "idempotency_store_unavailable", "the request ended while its key was registered; retry", nil)
		return
	}

	if m.cfg.Archive != nil && reg.MayBeArchived {
		rec, err := m.lookupOrRelease(ctx, scoped, fp, token)
		switch {
		case err == nil:
			m.release(ctx, scoped, fp, token)
			m.archived(w, r, rec)
			return
		case errors.Is(err, archive.ErrNotFound):
		case ctx.Err() != nil, errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled), errors.Is(err, archive.ErrMisconfigured):
			// The lookup failed because the request ended (the client went
			// away, a server timeout) or had too little time left to run it
			// (the Reader refuses a query it cannot finish before the
			// context's deadline, while the context is still live), not
			// because the archive is down: FailOpen must not run a key the
			// archive may hold. Nor does an archive that can never answer
			// (archive.ErrMisconfigured): FailOpen would run every key.
			m.release(ctx, scoped, fp, token)
			m.archiveUnavailable(w, r)
			return
		case m.cfg.OnArchiveError == FailOpen:
			m.cfg.Logger.WarnContext(ctx, "idempotency: archive unavailable, failing open", "error", err)
		default:
			m.cfg.Logger.ErrorContext(ctx, "idempotency: archive unavailable, failing closed", "error", err)
			m.release(ctx, scoped, fp, token)
			m.archiveUnavailable(w, r)
			return
		}
	}

	rec := &recorder{header: http.Header{}, status: http.StatusOK}
	returned := false
	defer func() {
		if returned {
			return
		}
		// The handler panicked; the panic goes on to the server's recovery.
		// A handler that had answered a success or a 4xx did what it
		// answered (a panic while it rendered, say): keep that outcome, so
		// that a retry replays it instead of running again. One that had
		// answered nothing, or a 5xx, frees the key for a retry.
		switch {
		case m.cfg.KeepServerErrors && !rec.wroteHeader:
			rec.WriteHeader(http.StatusInternalServerError)
			m.complete(ctx, scoped, fp, token, reg.Entry, rec.cutShort(m.path))
		case rec.wroteHeader && (m.cfg.KeepServerErrors || !rec.releases()):
			m.complete(ctx, scoped, fp, token, reg.Entry, rec.cutShort(m.path))
		default:
			m.releaseAfterRun(ctx, scoped, fp, token)
		}
	}()
	next.ServeHTTP(rec, withoutAcceptEncoding(r))
	returned = true

	if rec.invalid {
		m.cfg.Logger.ErrorContext(ctx, "idempotency: the handler wrote a status outside 100-599: answered and kept as 500", "status", rec.wrote)
	}
	if rec.releases() && !m.cfg.KeepServerErrors {
		m.releaseAfterRun(ctx, scoped, fp, token)
	} else {
		m.complete(ctx, scoped, fp, token, reg.Entry, rec)
	}
	for k, v := range rec.header {
		w.Header()[k] = v
	}
	w.WriteHeader(rec.status)
	_, _ = w.Write(rec.body.Bytes())
}

// complete records the handler's outcome, trying again after a failure for
// up to completeBudget: a key left in flight would be archived as never
// completed, and a late retry told original_status 0 instead of what the
// request did. Retrying is safe: Complete matches the in-flight entry of
// this fingerprint, so once one attempt has landed the next finds none
// (ErrNotInFlight), and stops.
func (m *Middleware) complete(ctx context.Context, scoped string, fp, token []byte, reg Entry, rec *recorder) {
	body, readable, err := rec.decoded()
	if err != nil {
		m.cfg.Logger.ErrorContext(ctx, "idempotency: the handler's answer is kept encoded: replays send it without its Content-Encoding (compress outside the middleware)", "key", scoped, "error", err)
	}
	c := Completion{Fingerprint: fp, Token: token, Status: rec.status, Body: body, ContentType: storableContentType(rec.header.Get("Content-Type")), ResourceID: resourceID(readable, m.path),
		CreatedAt: reg.CreatedAt, ExpiresAt: reg.ExpiresAt}
	if rec.resourceID != nil {
		c.ResourceID = *rec.resourceID
	}
	cctx, cancel := completionContext(ctx)
	defer cancel()
	retrying(cctx, completeAttempts, completeBackoff, func(attempt int) bool {
		err := m.cfg.Store.Complete(cctx, scoped, c)
		switch {
		case err == nil:
			return true
		case errors.Is(err, ErrNotInFlight) && attempt > 1:
			// An earlier attempt landed (its reply was lost, or the store
			// recorded the outcome and then failed, as a Redis store that
			// cannot write the archive row does): that attempt's error,
			// already logged, is the one to act on.
			return true
		}
		// Every failed attempt is logged: its error may be the only word
		// of a failure the next attempt cannot see (the Redis store keeps
		// a key it could not archive without expiry, and says so once).
		// The operation happened either way: it is answered, and retries
		// see the key in flight until it expires.
		m.cfg.Logger.ErrorContext(ctx, "idempotency: live store complete failed", "error", err, "attempt", attempt)
		return errors.Is(err, ErrNotInFlight)
	})
}

// completionContext bounds the recording of an outcome by completeBudget,
// whether or not the client is still there (its cancellation is dropped),
// and carries the request's deadline for RequestDeadline.
func completionContext(ctx context.Context) (context.Context, context.CancelFunc) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), completeBudget)
	if d, ok := ctx.Deadline(); ok {
		cctx = context.WithValue(cctx, requestDeadlineKey{}, d)
	}
	return cctx, cancel
}

type requestDeadlineKey struct{}

// RequestDeadline returns the deadline of the request whose outcome a
// Store.Complete call with ctx records, if it had one. The completion runs
// on past it, for up to 10 s in all (a server that lets handlers outlive
// their deadline, as http.TimeoutHandler does, records the outcome through
// a database blip), but that deadline may be the process's end (a Lambda
// invocation's): a store with a step that keeps the outcome safe should
// take it before that deadline while it lies ahead. The Redis store stops a
// stalled archive write in time to keep its hash without expiry; its next
// attempt, after the deadline, writes the row.
func RequestDeadline(ctx context.Context) (time.Time, bool) {
	d, ok := ctx.Value(requestDeadlineKey{}).(time.Time)
	return d, ok
}

// retrying calls try (with 1, 2, ...) until it returns true, attempts
// calls were made, or ctx ends, waiting attempt times backoff after each.
func retrying(ctx context.Context, attempts int, backoff time.Duration, try func(attempt int) (stop bool)) {
	for attempt := 1; !try(attempt) && attempt < attempts; attempt++ {
		select {
		case <-time.After(time.Duration(attempt) * backoff):
		case <-ctx.Done():
			return
		}
	}
}

// completeBudget and completeAttempts bound the recording of an outcome;
// the attempts wait completeBackoff, then twice and three times as long
// before them (0.2, 0.4 and 0.6 s). The answer waits for them (it is sent
// once its outcome is recorded, or given up on), so they are kept short:
// an outcome that is not recorded never runs again (a Postgres row stays in
// flight and is archived so; a Redis store keeps its hash without expiry),
// while a client that gives up waiting retries into 409 in flight.
const (
	completeBudget   = 10 * time.Second
	completeAttempts = 4
	completeBackoff  = 200 * time.Millisecond
)

// lookupOrRelease looks a freshly registered key up in the archive. An
// Archive that panics (a bug in one of the caller's) releases the
// registration before the panic goes on to the server's recovery: left in
// flight, the key would answer every retry 409 for its whole window, and
// then 409 expired, never completed, for an operation that never ran.
func (m *Middleware) lookupOrRelease(ctx context.Context, scoped string, fp, token []byte) (archive.Record, error) {
	defer func() {
		if p := recover(); p != nil {
			m.release(ctx, scoped, fp, token)
			panic(p)
		}
	}()
	return m.lookup(ctx, scoped, fp)
}

func (m *Middleware) lookup(ctx context.Context, scoped string, fp []byte) (archive.Record, error) {
	// Whether the request's own deadline, not ArchiveTimeout, bounds the
	// lookup. A Reader ends a query that nears the context's deadline with
	// a statement timeout of its own, answered as archive.ErrTimeout (with
	// archive.ErrDeadlineBound) while the request's context is still live:
	// when the request's deadline set that timeout, the lookup ran out of
	// the request's time, not the archive's, and must be answered as such
	// (never failed open). When the Reader's own StatementTimeout, or
	// ArchiveTimeout, ended it, the archive was slow: OnArchiveError decides.
	//
	// Conversely, a lookup the request's deadline did not bound that ends
	// in context.DeadlineExceeded or context.Canceled while the request is
	// still live was ended by the archive's side: ArchiveTimeout, the
	// Reader's backstop on a connection that stops answering or on a
	// statement prepared before its timeout is set, an archiveclient's own
	// Timeout. That is a slow archive, and is answered as archive.ErrTimeout
	// no longer matching either context error, so OnArchiveError decides.
	dl, ok := ctx.Deadline()
	requestBound := ok && time.Until(dl) < m.cfg.ArchiveTimeout
	actx, cancel := context.WithTimeout(ctx, m.cfg.ArchiveTimeout)
	defer cancel()
	rec, err := m.cfg.Archive.Lookup(actx, scoped, fp)
	switch {
	case err == nil:
	case requestBound && errors.Is(err, archive.ErrDeadlineBound) && !errors.Is(err, context.DeadlineExceeded):
		err = fmt.Errorf("%w (the request's deadline bounded the archive lookup): %w", context.DeadlineExceeded, err)
	case !requestBound && ctx.Err() == nil && !errors.Is(err, archive.ErrMisconfigured) &&
		(errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)):
		err = fmt.Errorf("%w: the archive did not answer within ArchiveTimeout (%s) or its own timeout: %v", archive.ErrTimeout, m.cfg.ArchiveTimeout, err)
	}
	return rec, err
}

// sweptClockAllowance is how far this process's clock may trail the
// database's before a row a sweeper archived (its expiry past by the
// database clock) could look unexpired here.
const sweptClockAllowance = time.Minute

// archived answers a key the archive holds.
func (m *Middleware) archived(w http.ResponseWriter, r *http.Request, rec archive.Record) {
	if rec.FingerprintMatch != nil && !*rec.FingerprintMatch {
		m.problem(w, r, http.StatusUnprocessableEntity, "idempotency_key_reused", "this key was used, before its window ended, for a different request", nil)
		return
	}
	// Archived while still inside its window: the live entry was lost, not
	// expired. Say so. A swept row's expiry is past by the database clock,
	// which this clock may trail: a store that only sweeps takes an expiry
	// as ahead only beyond sweptClockAllowance (or ClockSkew if larger),
	// where the row can only have been archived at completion by another
	// writer sharing the archive (a Redis store). Either answer is a 409
	// that does not run the request again; only its wording differs.
	ahead := m.cfg.Now()
	if !m.archivesAtCompletion {
		ahead = ahead.Add(max(m.cfg.ClockSkew, sweptClockAllowance))
	}
	if ahead.Before(rec.ExpiredAt) {
		m.responseLost(w, r, rec)
		return
	}
	m.expired(w, r, rec.Status, rec.ResourceID, rec.CreatedAt, rec.ExpiredAt)
}

// ahead answers a key the store refused because its timestamp lies further
// ahead than ClockSkew. Nothing was registered. Such a key may still have
// been stored by a writer that allowed more skew, or before writers bounded
// it, so the archive decides: a key it holds is answered from it; one it does
// not is a 400; an archive that cannot answer is a 503 whatever
// OnArchiveError says, because the key can neither be run nor refused
// unchecked.
func (m *Middleware) ahead(w http.ResponseWriter, r *http.Request, scoped string, fp []byte) {
	if m.cfg.Archive != nil {
		rec, err := m.lookup(r.Context(), scoped, fp)
		switch {
		case err == nil:
			m.archived(w, r, rec)
			return
		case !errors.Is(err, archive.ErrNotFound):
			m.cfg.Logger.ErrorContext(r.Context(), "idempotency: archive unavailable for a key whose timestamp is ahead", "error", err)
			m.archiveUnavailable(w, r)
			return
		}
	}
	ts, _ := keytime.FromKey(scoped)
	m.problem(w, r, http.StatusBadRequest, "idempotency_key_timestamp_ahead",
		fmt.Sprintf("the Idempotency-Key's timestamp (%s) lies more than %s ahead of the server's clock: mint keys from a clock synchronized to UTC",
			ts.UTC().Format(time.RFC3339Nano), m.cfg.ClockSkew), nil)
}

func (m *Middleware) archiveUnavailable(w http.ResponseWriter, r *http.Request) {
	m.retryAfter(w)
	m.problem(w, r, http.StatusServiceUnavailable, "archive_unavailable", "cannot tell whether this key was used before; retry later", nil)
}

func (m *Middleware) existing(w http.ResponseWriter, r *http.Request, scoped string, e Entry, fp []byte) {
	switch {
	case !bytes.Equal(e.Fingerprint, fp):
		m.problem(w, r, http.StatusUnprocessableEntity, "idempotency_key_reused", "this key was already used for a different request", nil)
	case m.windowEnded(e):
		// Expired but not yet swept into the archive: the same answer the
		// archive would give.
		status := e.Status
		if e.State == InFlight {
			status = archive.InFlightStatus
			rec, ok, err := m.archivedOutcome(r.Context(), scoped, fp, e)
			if err != nil {
				// The archive may hold the outcome of a request that
				// completed: "never completed" could be taken for
				// "never ran", and the operation run again under a new
				// key. Whatever OnArchiveError says, nothing runs here.
				m.cfg.Logger.ErrorContext(r.Context(), "idempotency: archive unavailable for a key that expired in flight", "error", err)
				m.archiveUnavailable(w, r)
				return
			}
			if ok {
				// The request completed but its store could not record it
				// (a Redis store archives first, then marks the hash): the
				// archive has the outcome.
				m.expired(w, r, rec.Status, rec.ResourceID, rec.CreatedAt, rec.ExpiredAt)
				return
			}
		}
		m.expired(w, r, status, m.archivedID(e), e.CreatedAt, e.ExpiresAt)
	case e.State == InFlight:
		m.retryAfter(w)
		m.problem(w, r, http.StatusConflict, "idempotency_key_in_flight", "a request with this key is still being processed", nil)
	case e.Status < 100 || e.Status > 599:
		// A completed entry no writer of this package leaves (it keeps a
		// status outside 100-599 as 500): written by hand, or damaged. It
		// cannot be replayed (net/http panics on a status below 100), and
		// the request must not run again.
		m.cfg.Logger.ErrorContext(r.Context(), "idempotency: completed live entry has no valid status", "key", scoped, "status", e.Status)
		m.problem(w, r, http.StatusInternalServerError, "idempotency_record_invalid", "this key completed, but its recorded answer cannot be replayed", nil)
	default:
		if e.ContentType != "" {
			w.Header().Set("Content-Type", e.ContentType)
		}
		w.Header().Set(HeaderReplayed, "true")
		w.WriteHeader(e.Status)
		_, _ = w.Write(e.Body)
	}
}

// archivedOutcome returns the archive's completed row for a key whose live
// entry expired in flight, when the archive holds one, and an error when
// the archive could not be read.
func (m *Middleware) archivedOutcome(ctx context.Context, scoped string, fp []byte, e Entry) (archive.Record, bool, error) {
	// Every store is looked up, a swept one too: its live row has no
	// archive row of its own yet, but the key may have an earlier one. A
	// late retry of an archived key registers a new live entry, finds the
	// key archived and releases the entry; a release that failed on every
	// attempt leaves that entry in flight, and its window's end must not
	// hide the archived outcome behind "never completed". Only an entry
	// whose window ended in flight comes here, which no request that
	// completed or released normally leaves.
	if m.cfg.Archive == nil {
		return archive.Record{}, false, nil
	}
	rec, err := m.lookup(ctx, scoped, fp)
	switch {
	case errors.Is(err, archive.ErrNotFound):
		return archive.Record{}, false, nil
	case err != nil:
		return archive.Record{}, false, err
	case rec.InFlight() || (rec.FingerprintMatch != nil && !*rec.FingerprintMatch):
		return archive.Record{}, false, nil
	}
	return rec, true, nil
}

func (m *Middleware) retryAfter(w http.ResponseWriter) {
	w.Header().Set("Retry-After", strconv.Itoa(int(max(1, m.cfg.RetryAfter.Round(time.Second)/time.Second))))
}

func (m *Middleware) expired(w http.ResponseWriter, r *http.Request, status int, resourceID *string, created, expired time.Time) {
	m.cfg.Metrics.Emit(metrics.Count(metrics.ExpiredReplayTotal, 1))
	detail := fmt.Sprintf("this key was first used at %s and expired at %s; the original request is not run again",
		instantText(created), instantText(expired))
	m.problem(w, r, http.StatusConflict, "idempotency_key_expired", detail, map[string]any{
		"original_status": status,
		"resource_id":     resourceID,
		"created_at":      archive.JSONTime(created),
		"expired_at":      archive.JSONTime(expired),
	})
}

// instantText writes t for a problem's detail: an instant the row does not
// know (the zero time, archive.Instant's for an infinite one, which a row
// written by hand may hold) is "an unknown time", not year 1. A known one
// is written even where its JSON member is null (a BC date).
func instantText(t time.Time) string {
	if t.IsZero() {
		return "an unknown time"
	}
	return t.UTC().Format(time.RFC3339)
}

// responseLost answers a key the archive holds whose window has not ended:
// its live entry (and so its response) was lost. The operation is not run
// again, and the answer does not pretend the key expired.
func (m *Middleware) responseLost(w http.ResponseWriter, r *http.Request, rec archive.Record) {
	m.cfg.Logger.WarnContext(r.Context(), "idempotency: live entry lost before its window ended; answered from the archive",
		"expires_at", rec.ExpiredAt)
	detail := fmt.Sprintf("this key was first used at %s and its window lasts until %s, but its stored response is no longer available; the original request is not run again",
		instantText(rec.CreatedAt), instantText(rec.ExpiredAt))
	m.problem(w, r, http.StatusConflict, "idempotency_key_response_unavailable", detail, map[string]any{
		"original_status": rec.Status,
		"resource_id":     rec.ResourceID,
		"created_at":      archive.JSONTime(rec.CreatedAt),
		"expires_at":      archive.JSONTime(rec.ExpiredAt),
	})
}

// release frees the key even when the client has gone away: a key left in
// flight would block retries for the whole window, then be archived as never
// completed (the archive lookup prefers a completed row over it). Release
// matches this request's registration token, so it never frees another
// request's entry. It is for a registration whose handler never started:
// through BeforeRunReleaser where the store has it (see there).
func (m *Middleware) release(ctx context.Context, key string, fp, token []byte) {
	release := m.cfg.Store.Release
	if br, ok := storeAs[BeforeRunReleaser](m.cfg.Store); ok {
		release = br.ReleaseBeforeRun
	}
	m.releaseBy(ctx, release, key, fp, token)
}

// releaseAfterRun frees the key of a request whose handler ran and answered
// a server error, through the store's Release: a store that keeps an entry
// whose window has ended keeps this one too.
func (m *Middleware) releaseAfterRun(ctx context.Context, key string, fp, token []byte) {
	m.releaseBy(ctx, m.cfg.Store.Release, key, fp, token)
}

// releaseBy tries a release up to releaseAttempts times within
// releaseBudget. A release that failed once (a connection reset, a
// failover) leaves the key in flight for its whole window: every retry is
// told 409 in flight, and with an archive hit behind it the key's recorded
// outcome stays hidden until the window ends. Trying again is safe only
// with a token: a release then matches this registration's entry alone,
// and one that already landed (its reply lost) matches nothing the next
// time. Without one it is tried once.
func (m *Middleware) releaseBy(ctx context.Context, release func(context.Context, string, []byte, []byte) error, key string, fp, token []byte) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseBudget)
	defer cancel()
	attempts := releaseAttempts
	if token == nil {
		// A store that keeps no tokens (a database before migration 008)
		// releases any token-less entry of this key and fingerprint: once
		// the first attempt landed (its reply lost), a retry of this key
		// may have registered anew and started its handler, and a second
		// attempt would free its entry for a third to run beside it.
		attempts = 1
	}
	retrying(rctx, attempts, releaseBackoff, func(attempt int) bool {
		err := release(rctx, key, fp, token)
		if err != nil {
			m.cfg.Logger.ErrorContext(ctx, "idempotency: live store release failed", "error", err, "attempt", attempt)
		}
		return err == nil
	})
}

// releaseBudget, releaseAttempts and releaseBackoff bound a release as
// completeBudget and its kin bound a completion (0.1, 0.2 and 0.3 s between
// the attempts): the answer waits for them.
const (
	releaseBudget   = 5 * time.Second
	releaseAttempts = 4
	releaseBackoff  = 100 * time.Millisecond
)

// problem writes an RFC 9457 problem with a stable code and extension members.
func (m *Middleware) problem(w http.ResponseWriter, _ *http.Request, status int, code, detail string, ext map[string]any) {
	p := problem.New(status, code, detail)
	p.Extensions = ext
	problem.Write(w, p)
}

// storableContentType drops a Content-Type that PostgreSQL text could not
// hold (NUL, invalid UTF-8), so an odd header never fails a completion.
func storableContentType(ct string) string {
	if !utf8.ValidString(ct) || strings.IndexByte(ct, 0) >= 0 || len(ct) > 1024 {
		return ""
	}
	return ct
}

// MaxResourceIDBytes bounds the resource id kept from a response: an id is
// short, and the archive keeps it forever.
const MaxResourceIDBytes = 255

// resourceID reads a string at path in a JSON body (resourceid.Find), or
// nil; an id PostgreSQL text cannot hold (a NUL byte), or one longer than
// MaxResourceIDBytes, is not kept.
func resourceID(body []byte, path []string) *string {
	return boundedID(resourceid.Find(body, path))
}

// archivedID is the resource id the sweeper archives for e, for an answer
// before the sweep that is the same as after it: the one recorded, within
// the archive's bound; for a row with none recorded whose response another
// writer stored as jsonb (in whatever state: the sweeper reads it in
// every one), the one at the resource id path, read as jsonb reads it. The
// sweeper's own path (SWEEP_RESOURCE_ID_PATH) must be this middleware's.
func (m *Middleware) archivedID(e Entry) *string {
	if e.ResourceID != nil {
		return boundedID(*e.ResourceID, true)
	}
	if !e.BodyIsJSONB {
		return nil
	}
	return resourceID(e.Body, m.path)
}

// boundedID is s when it is an id the archive keeps (the sweeper's bound,
// and no NUL, which PostgreSQL text cannot hold), else nil.
func boundedID(s string, ok bool) *string {
	if !ok || len(s) > MaxResourceIDBytes || strings.IndexByte(s, 0) >= 0 {
		return nil
	}
	return &s
}

// recorder buffers the handler's response so that it can be stored before it
// is sent.
type recorder struct {
	header      http.Header
	status      int
	wroteHeader bool
	// invalid says the handler wrote a status outside 100-599 (net/http
	// takes up to 999; WriteHeader(0) would panic), which the recorder
	// answers and keeps as 500; wrote is the status it wrote.
	invalid bool
	wrote   int
	body    bytes.Buffer
	// resourceID, when set, is the resource id to record instead of the
	// one the body gives (see cutShort).
	resourceID **string
}

func (r *recorder) Header() http.Header { return r.header }

// WriteHeader records the final status. An informational status (1xx, such
// as 103 Early Hints) is not the answer and is never stored: a later
// WriteHeader or Write sets the real one.
func (r *recorder) WriteHeader(status int) {
	if status >= 100 && status < 200 || r.wroteHeader {
		return
	}
	r.wroteHeader = true
	if status < 100 || status > 599 {
		r.invalid, r.wrote, status = true, status, http.StatusInternalServerError
	}
	r.status = status
}

// cutShort returns the outcome to keep for a handler that answered and then
// panicked: its status and the resource id its body gives (when the body is
// whole JSON), but not the body itself, which the panic may have cut off (a
// replay would present half a JSON document as the answer). The replay's
// body is a problem that says what happened.
func (r *recorder) cutShort(path []string) *recorder {
	_, readable, _ := r.decoded()
	rid := resourceID(readable, path)
	out := &recorder{header: http.Header{}, status: r.status, wroteHeader: true, resourceID: &rid}
	p := problem.New(r.status, "idempotency_response_incomplete",
		fmt.Sprintf("the request was processed (status %d) but its response was cut short by a server error; it is not run again", r.status))
	if rid != nil {
		p = p.With("resource_id", *rid)
	}
	b, _ := json.Marshal(p)
	out.body.Write(b)
	out.header.Set("Content-Type", problem.ContentType)
	return out
}

// maxDecodedBody bounds the body a gzip-encoded answer is stored as.
const maxDecodedBody = 16 << 20

// decoded returns the handler's body as the outcome is stored and replayed
// (stored), and as far as it could be read (readable, which the resource id
// is read from): without a Content-Encoding, which a stored outcome does not
// keep (it keeps the body and its Content-Type). A gzip body is stored
// decoded, and its replays are sent plain; a body in another encoding, or
// one that does not decode whole, is stored as written, with an error
// saying why (what of it decoded is still readable: a handler cut short
// before it closed its gzip stream wrote its resource id all the same). An
// empty body, or a Content-Encoding of identity alone, is plain. The handler
// gets the request without its Accept-Encoding (withoutAcceptEncoding), so
// one that compresses only what a client accepts never gets here.
func (r *recorder) decoded() (stored, readable []byte, err error) {
	raw := r.body.Bytes()
	var codings []string
	for _, v := range r.header.Values("Content-Encoding") {
		for c := range strings.SplitSeq(v, ",") {
			if c = strings.ToLower(strings.TrimSpace(c)); c != "" && c != "identity" {
				codings = append(codings, c)
			}
		}
	}
	switch {
	case len(codings) == 0 || len(raw) == 0:
		return raw, raw, nil
	case len(codings) > 1 || (codings[0] != "gzip" && codings[0] != "x-gzip"):
		return raw, raw, fmt.Errorf("a Content-Encoding of %q, which is stored as written", strings.Join(codings, ", "))
	}
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		return raw, raw, fmt.Errorf("a gzip body that does not decode: %w", err)
	}
	b, err := io.ReadAll(io.LimitReader(zr, maxDecodedBody+1))
	switch {
	case err != nil:
		return raw, b, fmt.Errorf("a gzip body that does not decode whole: %w", err)
	case len(b) > maxDecodedBody:
		return raw, raw, fmt.Errorf("a gzip body of more than %d bytes decoded", maxDecodedBody)
	}
	return b, b, nil
}

// withoutAcceptEncoding returns r without its Accept-Encoding header (on a
// copy: the caller's request is left as it was), so that the handler
// answers a body its outcome can be stored and replayed as. Compression
// belongs outside the middleware.
func withoutAcceptEncoding(r *http.Request) *http.Request {
	if _, ok := r.Header["Accept-Encoding"]; !ok {
		return r
	}
	out := r.WithContext(r.Context())
	out.Header = r.Header.Clone()
	out.Header.Del("Accept-Encoding")
	return out
}

// releases says whether the outcome frees the key for a retry: a 5xx the
// handler chose, which says nothing happened. A status it wrote outside
// 100-599 says nothing of what happened, so the key keeps the 500 it is
// answered with.
func (r *recorder) releases() bool {
	return r.status >= 500 && !r.invalid
}

func (r *recorder) Write(p []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	return r.body.Write(p)
}
