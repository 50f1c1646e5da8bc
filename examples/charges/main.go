// Command charges is a small charges API on :8080 behind the idempotency
// middleware with the Postgres live store and the archive read directly:
//
//	POST /v1/charges {"amount": 4500, "currency": "gbp"}   (Idempotency-Key required)
//	GET  /v1/charges/{id}
//	GET  /v1/charges
//
// It reads DATABASE_URL and the configuration variables of the README
// (LIVE_TTL, CLOCK_SKEW, METRICS_NAMESPACE...), and ADDR
// (default :8080). EMF metric lines go to stdout, logs to stderr.
package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/database"
	"github.com/idemarchive/idemarchive/shared/idempotency"
	"github.com/idemarchive/idemarchive/shared/livestore"
	"github.com/idemarchive/idemarchive/shared/metrics"
	"github.com/idemarchive/idemarchive/shared/settings"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Getenv); err != nil {
		fmt.Fprintln(os.Stderr, "charges:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, getenv func(string) string) error {
	s, err := settings.FromEnv(getenv)
	if err != nil {
		// A variable's error echoes its value, which may be a connection
		// string pasted into the wrong one.
		return errors.New(settings.Redact(err.Error()))
	}
	logger := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	pool, err := database.Open(ctx, s.Database, nil)
	if err != nil {
		return err
	}
	defer pool.Close()
	emitter := metrics.New(os.Stdout, s.MetricsNamespace)
	reader, err := archive.NewReader(pool, s.Archive, emitter)
	if err != nil {
		return err
	}
	arch := s.Archive.WithDefaults()
	mw, err := idempotency.New(idempotency.Config{
		Store: livestore.NewPostgres(pool),
		// The demo has no authentication, and the runbook's verification
		// expects the probe key unscoped (idem:v1:probe): one key space.
		SingleTenant: true,
		Archive:      reader,
		LiveTTL:      arch.LiveTTL,
		ClockSkew:    s.ClockSkew,
		// The same path the sweeper falls back to for rows without one.
		ResourceIDPath: s.Sweep.WithDefaults().ResourceIDPath,
		Required:       true,
		Metrics:        emitter,
		Logger:         logger,
	})
	if err != nil {
		return err
	}
	c := newCharges()
	mux := http.NewServeMux()
	mux.Handle("POST /v1/charges", mw.Wrap(http.HandlerFunc(c.create)))
	mux.HandleFunc("GET /v1/charges", c.list)
	mux.HandleFunc("GET /v1/charges/{id}", c.get)

	addr := cmp.Or(getenv("ADDR"), ":8080")
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("%w (is another server on %s? set ADDR, for example ADDR=:8081)", err, addr)
	}
	// A client that sends its body slowly is cut off, not held forever: the
	// middleware reads the body (up to 1 MiB) before it registers the key.
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute}
	logger.Info("charges API listening", "addr", ln.Addr().String(), "live_ttl", arch.LiveTTL.String())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
