package problem

import (
	"encoding/json"
	"net/http/httptest"
	"testing"
)

func TestWriteFlattensExtensions(t *testing.T) {
	w := httptest.NewRecorder()
	Write(w, New(409, "idempotency_key_expired", "expired").With("original_status", 201).With("resource_id", nil))
	if w.Code != 409 || w.Header().Get("Content-Type") != ContentType {
		t.Fatalf("status %d, content type %q", w.Code, w.Header().Get("Content-Type"))
	}
	var doc map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"type": "urn:idemarchive:problem:idempotency_key_expired", "title": "Conflict", "status": 409.0,
		"code": "idempotency_key_expired", "detail": "expired", "original_status": 201.0, "resource_id": nil}
	if len(doc) != len(want) {
		t.Fatalf("members %v, want %v", doc, want)
	}
	for k, v := range want {
		if doc[k] != v {
			t.Errorf("%s = %v, want %v", k, doc[k], v)
		}
	}
	// Without extensions, the standard members only, and round-trippable.
	b, _ := json.Marshal(New(404, "key_not_found", ""))
	var p Problem
	if err := json.Unmarshal(b, &p); err != nil || p.Code != "key_not_found" || p.Status != 404 {
		t.Fatalf("round trip: %s %+v %v", b, p, err)
	}
}
