package database

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
	arn          string
	ttl          time.Duration
	minRefetch   time.Duration
	client       *secretsmanager.Client
	overrideHost bool // DATABASE_URL names the host (an RDS Proxy endpoint)

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

// apply fills cc with the credentials, and unless DATABASE_URL names the
// endpoint, the host, port and database of sec.
func (s *secretSource) apply(cc *pgx.ConnConfig, sec rdsSecret) error {
	cc.User, cc.Password = sec.Username, sec.Password
	if !s.overrideHost {
		if sec.Host == "" {
			return errors.New("database secret names no host: set DATABASE_URL to the endpoint")
		}
		cc.Host = sec.Host
		switch {
		case isLocal(sec.Host):
			cc.TLSConfig = nil // a local server (a test rig) need not speak TLS
		case cc.TLSConfig != nil:
			cc.TLSConfig = cc.TLSConfig.Clone()
			cc.TLSConfig.ServerName = sec.Host
		}
		if port, err := parsePort(sec.Port); err == nil {
			cc.Port = port
		}
		if sec.DBName != "" {
			cc.Database = sec.DBName
		}
	}
	return nil
}

func parsePort(raw json.RawMessage) (uint16, error) {
	var n uint16
	if err := json.Unmarshal(raw, &n); err == nil && n > 0 {
		return n, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return 0, errors.New("no port")
	}
	_, err := fmt.Sscanf(s, "%d", &n)
	return n, err
}
