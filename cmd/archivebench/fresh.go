package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/idempotency"
	"github.com/idemarchive/idemarchive/shared/keytime"
	"github.com/idemarchive/idemarchive/shared/livestore"
)

// freshResult is the archive's cost on the fresh-key path for one key shape.
type freshResult struct {
	Keys            string  `json:"keys"`
	Requests        int     `json:"requests"`
	Lookups         int64   `json:"archive_lookups"`
	LookupsPer1000  float64 `json:"lookups_per_1000"`
	RequestP50MS    float64 `json:"request_p50_ms"`
	RequestP99MS    float64 `json:"request_p99_ms"`
	P50VsTimestamps float64 `json:"p50_vs_uuidv7"`
}

type freshSection struct {
	Results []freshResult `json:"results"`
}

// countingArchive counts the lookups the middleware makes.
type countingArchive struct {
	inner idempotency.Archive
	n     atomic.Int64
}

func (c *countingArchive) Lookup(ctx context.Context, key string, fp []byte) (archive.Record, error) {
	c.n.Add(1)
	return c.inner.Lookup(ctx, key, fp)
}

var _ idempotency.Archive = (*countingArchive)(nil)

// benchFresh sends fresh requests through the middleware with the Postgres
// live store and counts the archive lookups they cost: none for UUIDv7 and
// ULID keys (the store proves no earlier life of them can be archived yet),
// one each for random UUIDv4 keys.
func benchFresh(ctx context.Context, base string, requests int, p *progress) (freshSection, error) {
	var sec freshSection
	db, err := newBenchDB(ctx, base, "fresh")
	if err != nil {
		return sec, err
	}
	defer db.Drop()
	if _, err := db.partitions(ctx); err != nil {
		return sec, err
	}
	reader, err := archive.NewReader(db.Pool, archive.Config{}, nil)
	if err != nil {
		return sec, err
	}
	g := newKeyGen(3)
	shapesToRun := []struct {
		name string
		key  func() string
	}{
		{"UUIDv7 (minted now)", func() string { return g.uuidV7(time.Now()) }},
		{"ULID (minted now)", func() string { return g.ulid(time.Now()) }},
		{"UUIDv4 (random)", g.uuidV4},
	}
	for _, s := range shapesToRun {
		counter := &countingArchive{inner: reader}
		mw, err := idempotency.New(idempotency.Config{
			Store:        livestore.NewPostgres(db.Pool),
			Archive:      counter,
			LiveTTL:      24 * time.Hour,
			ClockSkew:    keytime.DefaultClockSkew,
			Required:     true,
			SingleTenant: true,
		})
		if err != nil {
			return sec, err
		}
		n := 0
		handler := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n++
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"id":"ch_%024d","amount":4500,"currency":"gbp","status":"succeeded"}`, n)
		}))
		p.Step("fresh keys: %d requests with %s keys", requests, s.name)
		var times []time.Duration
		for i := 0; i < requests; i++ {
			r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/charges", strings.NewReader(`{"amount":4500,"currency":"gbp"}`))
			r.Header.Set(idempotency.HeaderKey, s.key())
			w := httptest.NewRecorder()
			t0 := time.Now()
			handler.ServeHTTP(w, r)
			times = append(times, time.Since(t0))
			if w.Code != http.StatusCreated {
				return sec, fmt.Errorf("fresh request %d with %s keys: %d %s", i, s.name, w.Code, strings.TrimSpace(w.Body.String()))
			}
			if i%200 == 0 {
				p.Update("%d/%d", i, requests)
			}
		}
		sec.Results = append(sec.Results, freshResult{
			Keys:           s.name,
			Requests:       requests,
			Lookups:        counter.n.Load(),
			LookupsPer1000: float64(counter.n.Load()) * 1000 / float64(requests),
			RequestP50MS:   ms(percentile(times, 50)),
			RequestP99MS:   ms(percentile(times, 99)),
		})
	}
	for i := range sec.Results {
		sec.Results[i].P50VsTimestamps = ratio(sec.Results[i].RequestP50MS, sec.Results[0].RequestP50MS)
	}
	return sec, nil
}
