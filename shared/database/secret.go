package database

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// rdsSecret is the JSON shape of the secrets RDS generates and rotates.
type rdsSecret struct {
	Username string          `json:"username"`
	Password string          `json:"password"`
	Host     string          `json:"host"`
	Port     json.RawMessage `json:"port"` // a number, sometimes a string
	DBName   string          `json:"dbname"`
}

func (r rdsSecret) sameCredentials(o rdsSecret) bool {
	return r.Username == o.Username && r.Password == o.Password
}

// secretSource fetches a database secret once and again after ttl, and fills
// connection settings from it before every new connection.
//
// A rotation changes the password in PostgreSQL before a cached copy expires,
// so a new connection may present the old password and fail with 28P01. To
// hide that, a connection made with a secret fetched more than minRefetch ago
// is tried first (a probe that is closed at once); on an authentication
// failure the secret is fetched again and the pool's own attempt uses the new
// one: one retry, and at most one fetch per minRefetch however many
// connections fail. A connection made with a secret fetched within minRefetch
// is not probed: no newer secret could be fetched for its retry, so its one
// attempt is the pool's. The probe costs one extra connection setup per new
// pool connection (pools here are 2 to 4 connections that live for an hour),
// never more than one.
type secretSource struct {
	arn        string
	ttl        time.Duration
	minRefetch time.Duration
	client     *secretsmanager.Client
	fromURL    settingsNamed // what DATABASE_URL names itself (an RDS Proxy endpoint, say)

	mu        sync.Mutex
	secret    rdsSecret
	fetchedAt time.Time // of secret
	triedAt   time.Time // of the last fetch, successful or not
}

// get returns the cached secret, fetching it when there is none or it is
// older than ttl, and whether a fetch was tried within minRefetch (so that
// refetch would refuse to try again).
func (s *secretSource) get(ctx context.Context) (rdsSecret, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.fetchedAt.IsZero():
		if err := s.fetchLocked(ctx); err != nil {
			return rdsSecret{}, false, err
		}
	case time.Since(s.fetchedAt) >= s.ttl && time.Since(s.triedAt) >= s.minRefetch:
		// On failure keep using the last good secret.
		_ = s.fetchLocked(ctx)
	}
	return s.secret, time.Since(s.triedAt) < s.minRefetch, nil
}

// refetch returns a secret to retry with after rejected failed
// authentication: the cached one if another connection has replaced it since,
// else a newly fetched one, unless the last fetch was less than minRefetch
// ago. ok is false when there is nothing new to try.
func (s *secretSource) refetch(ctx context.Context, rejected rdsSecret) (sec rdsSecret, ok bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.secret.sameCredentials(rejected) {
		return s.secret, true, nil
	}
	if time.Since(s.triedAt) < s.minRefetch {
		return rdsSecret{}, false, nil
	}
	if err := s.fetchLocked(ctx); err != nil {
		return rdsSecret{}, false, err
	}
	return s.secret, !s.secret.sameCredentials(rejected), nil
}

func (s *secretSource) fetchLocked(ctx context.Context) error {
	s.triedAt = time.Now()
	out, err := s.client.GetSecretValue(ctx, &secretsmanager.GetSecretValueInput{SecretId: aws.String(s.arn)})
	if err != nil {
		return fmt.Errorf("fetch database secret: %w", err)
	}
	var sec rdsSecret
	if out.SecretString == nil || json.Unmarshal([]byte(*out.SecretString), &sec) != nil {
		return errors.New("database secret is not the JSON that RDS generates (username, password, host, port, dbname)")
	}
	if sec.Username == "" || sec.Password == "" {
		return errors.New("database secret lacks a username or password")
	}
	s.secret, s.fetchedAt = sec, time.Now()
	return nil
}

func (s *secretSource) beforeConnect(ctx context.Context, cc *pgx.ConnConfig) error {
	sec, fresh, err := s.get(ctx)
	if err != nil {
		return err
	}
	orig := cc.Copy()
	if err := s.apply(cc, sec); err != nil || fresh {
		return err
	}
	probe, err := pgconn.ConnectConfig(ctx, &cc.Config)
	if err == nil {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = probe.Close(closeCtx)
		return nil
	}
	if SQLState(err) != CodeInvalidPassword {
		return err
	}
	next, ok, ferr := s.refetch(ctx, sec)
	if ferr != nil {
		return fmt.Errorf("%w (and the secret could not be fetched again: %v)", err, ferr)
	}
	if !ok {
		return err
	}
	*cc = *orig
	return s.apply(cc, next)
}

// apply fills cc with the credentials of sec, and with whichever of host,
// port and database DATABASE_URL does not name: the host when the URL names
// none, the port when it names neither host nor port (a proxy's port is not
// the instance's), the database when it names none. A host or port of the
// secret that is used and is not one is refused (one that is not used, as
// behind a proxy the URL names, is not read); the message holds no value of
// the secret.
func (s *secretSource) apply(cc *pgx.ConnConfig, sec rdsSecret) error {
	cc.User, cc.Password = sec.Username, sec.Password
	if !s.fromURL.database() && sec.DBName != "" {
		cc.Database = sec.DBName
	}
	if s.fromURL.host() {
		return nil
	}
	switch {
	case sec.Host == "":
		return errors.New("database secret names no host: set DATABASE_URL to the endpoint")
	case !plausibleHost(sec.Host):
		return errors.New("database secret has an invalid host")
	}
	port := cc.Port
	if !s.fromURL.port() {
		p, hasPort, err := parsePort(sec.Port)
		if err != nil {
			return err
		}
		if hasPort {
			port = p
		}
	}
	// Every attempt of the placeholder (one host; two under sslmode=prefer
	// or allow) now goes to the secret's host.
	cc.Host, cc.Port = sec.Host, port
	if isLocal(sec.Host) {
		// A local server (a test rig) need not speak TLS.
		cc.TLSConfig, cc.Fallbacks = nil, nil
		return nil
	}
	cc.TLSConfig = withServerName(cc.TLSConfig, sec.Host)
	for _, f := range cc.Fallbacks {
		f.Host, f.Port, f.TLSConfig = sec.Host, port, withServerName(f.TLSConfig, sec.Host)
	}
	return nil
}

func withServerName(t *tls.Config, host string) *tls.Config {
	if t == nil {
		return nil
	}
	t = t.Clone()
	t.ServerName = host
	return t
}

// errSecretPort is the error for a secret whose port is not one.
var errSecretPort = errors.New("database secret has an invalid port (want a number or a decimal string, 1 to 65535)")

// parsePort reads the port of an RDS secret: a JSON number or a string of
// decimal digits, 1 to 65535. ok is false when the secret has none (absent
// or null).
func parsePort(raw json.RawMessage) (port uint16, ok bool, err error) {
	if len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null" {
		return 0, false, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return 0, false, errSecretPort
	}
	var text string
	switch v := v.(type) {
	case json.Number:
		text = v.String()
	case string:
		text = v
	default:
		return 0, false, errSecretPort
	}
	n, err := strconv.ParseUint(text, 10, 16)
	if err != nil || n == 0 {
		return 0, false, errSecretPort
	}
	return uint16(n), true, nil
}
