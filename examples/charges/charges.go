package main

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/idemarchive/idemarchive/shared/problem"
	"github.com/idemarchive/idemarchive/shared/strictjson"
)

// Charge is the demo's resource.
type Charge struct {
	ID       string `json:"id"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	Status   string `json:"status"`
	Created  int64  `json:"created"`
}

// charges is an in-memory charges API: POST creates, GET reads back.
type charges struct {
	mu   sync.Mutex
	byID map[string]Charge
}

func newCharges() *charges { return &charges{byID: map[string]Charge{}} }

// currencyRE is checked before the code is lower-cased: strings.ToLower
// makes ASCII of some other letters (the Kelvin sign becomes 'k').
var currencyRE = regexp.MustCompile(`^[A-Za-z]{3}$`)

// maxChargeBody bounds a charge's request body.
const maxChargeBody = 1 << 16

func (c *charges) create(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Amount   int64  `json:"amount"`
		Currency string `json:"currency"`
	}
	// A payment's body must mean one thing to everyone who reads it (a
	// proxy, a validator, this handler): a member given twice, or in
	// another letter case, or anything after the object, is refused
	// rather than read by its last occurrence.
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxChargeBody))
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		fail(w, http.StatusRequestEntityTooLarge, "body_too_large", fmt.Sprintf("the body is larger than %d bytes", tooLarge.Limit))
		return
	}
	if err != nil || strictjson.Decode(body, &in, true) != nil {
		fail(w, http.StatusBadRequest, "invalid_json", "the body must be one JSON object with amount and currency, each given once")
		return
	}
	if in.Amount <= 0 {
		fail(w, http.StatusBadRequest, "invalid_amount", "amount must be a positive whole number of minor units")
		return
	}
	if !currencyRE.MatchString(in.Currency) {
		fail(w, http.StatusBadRequest, "invalid_currency", "currency must be a three-letter ISO 4217 code")
		return
	}
	in.Currency = strings.ToLower(in.Currency)
	var b [12]byte
	_, _ = rand.Read(b[:])
	ch := Charge{ID: "ch_" + hex.EncodeToString(b[:]), Amount: in.Amount, Currency: in.Currency, Status: "succeeded", Created: time.Now().Unix()}
	c.mu.Lock()
	c.byID[ch.ID] = ch
	c.mu.Unlock()
	writeJSON(w, http.StatusCreated, ch)
}

func (c *charges) list(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	out := make([]Charge, 0, len(c.byID))
	for _, ch := range c.byID {
		out = append(out, ch)
	}
	c.mu.Unlock()
	slices.SortFunc(out, func(a, b Charge) int { return cmp.Compare(a.ID, b.ID) })
	writeJSON(w, http.StatusOK, map[string]any{"data": out})
}

func (c *charges) get(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	ch, ok := c.byID[r.PathValue("id")]
	c.mu.Unlock()
	if !ok {
		fail(w, http.StatusNotFound, "charge_not_found", "no charge with this id")
		return
	}
	writeJSON(w, http.StatusOK, ch)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func fail(w http.ResponseWriter, status int, code, detail string) {
	problem.Write(w, problem.New(status, code, detail))
}
