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
)

// rdsSecret is the JSON shape of the secrets RDS generates and rotates.
type rdsSecret struct {
	Username string          `json:"username"`
	Password string          `json:"password"`
	Host     string          `json:"host"`
	Port     json.RawMessage `json:"port"` // a number, sometimes a string
	DBName   string          `json:"dbname"`
}

// secretSource fetches a database secret once and again after ttl, and fills
// connection settings from it before every new connection.
type secretSource struct {
	arn          string
	ttl          time.Duration
	client       *secretsmanager.Client
	overrideHost bool // DATABASE_URL names the host (an RDS Proxy endpoint)

	mu        sync.Mutex
	secret    rdsSecret
	fetchedAt time.Time
}

func (s *secretSource) get(ctx context.Context) (rdsSecret, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.fetchedAt.IsZero() && time.Since(s.fetchedAt) < s.ttl {
		return s.secret, nil
	}
	out, err := s.client.GetSecretValue(ctx, &secretsmanager.GetSecretValueInput{SecretId: aws.String(s.arn)})
	if err != nil {
		if !s.fetchedAt.IsZero() {
			return s.secret, nil // keep using the last good secret
		}
		return rdsSecret{}, fmt.Errorf("fetch database secret: %w", err)
	}
	var sec rdsSecret
	if out.SecretString == nil || json.Unmarshal([]byte(*out.SecretString), &sec) != nil {
		return rdsSecret{}, errors.New("database secret is not the JSON that RDS generates (username, password, host, port, dbname)")
	}
	if sec.Username == "" || sec.Password == "" {
		return rdsSecret{}, errors.New("database secret lacks a username or password")
	}
	s.secret, s.fetchedAt = sec, time.Now()
	return sec, nil
}

func (s *secretSource) beforeConnect(ctx context.Context, cc *pgx.ConnConfig) error {
	sec, err := s.get(ctx)
	if err != nil {
		return err
	}
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
