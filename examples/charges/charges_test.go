package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCreateValidatesAndReadsBack(t *testing.T) {
	t.Parallel()
	c := newCharges()
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/charges", c.create)
	mux.HandleFunc("GET /v1/charges", c.list)
	mux.HandleFunc("GET /v1/charges/{id}", c.get)
	do := func(method, path, body string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, httptest.NewRequest(method, path, strings.NewReader(body)))
		return w
	}

	for body, code := range map[string]string{
		`not json`:                            "invalid_json",
		`{"amount":1,"currency":"gbp","x":1}`: "invalid_json",
		`{"amount":0,"currency":"gbp"}`:       "invalid_amount",
		`{"amount":-5,"currency":"gbp"}`:      "invalid_amount",
		`{"amount":100,"currency":"pounds"}`:  "invalid_currency",
		`{"amount":100}`:                      "invalid_currency",
		// A body that could be read two ways is refused, not charged by
		// its last (or first) reading.
		`{"amount":1,"currency":"gbp","amount":999999}`:                 "invalid_json",
		`{"amount":1,"currency":"gbp","AMOUNT":999999}`:                 "invalid_json",
		`{"Amount":1,"currency":"gbp"}`:                                 "invalid_json",
		`{"amount":4500,"currency":"gbp"} trailing`:                     "invalid_json",
		`{"amount":4500,"currency":"gbp"}{"amount":1,"currency":"gbp"}`: "invalid_json",
		"{\"amount\":1,\"currency\":\"gb\xff\"}":                        "invalid_json",
		// Lower-cased, the Kelvin sign is ASCII 'k': checked as written.
		`{"amount":100,"currency":"\u212aRW"}`: "invalid_currency",
	} {
		w := do("POST", "/v1/charges", body)
		require.Equal(t, 400, w.Code, body)
		require.Contains(t, w.Body.String(), `"code":"`+code+`"`, body)
	}

	// A well-formed body over the limit is told so, not called invalid.
	big := `{"amount":4500,"currency":"gbp"}` + strings.Repeat(" ", maxChargeBody)
	w := do("POST", "/v1/charges", big)
	require.Equal(t, 413, w.Code)
	require.Contains(t, w.Body.String(), `"code":"body_too_large"`)

	w = do("POST", "/v1/charges", `{"amount":4500,"currency":"GBP"}`)
	require.Equal(t, 201, w.Code)
	var ch Charge
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &ch))
	require.True(t, strings.HasPrefix(ch.ID, "ch_"))
	require.Equal(t, "gbp", ch.Currency)

	w = do("GET", "/v1/charges/"+ch.ID, "")
	require.Equal(t, 200, w.Code)
	require.Contains(t, w.Body.String(), ch.ID)
	require.Equal(t, 404, do("GET", "/v1/charges/ch_nope", "").Code)
	require.Contains(t, do("GET", "/v1/charges", "").Body.String(), ch.ID)
}
