// Package problem writes RFC 9457 problem details (application/problem+json)
// with a stable machine code, for every HTTP-facing part of this project.
//
//	problem.Write(w, problem.New(http.StatusConflict, "idempotency_key_expired", "this key expired").
//		With("original_status", 201))
package problem

import (
	"encoding/json"
	"net/http"
)

// ContentType is the media type of a problem document.
const ContentType = "application/problem+json"

// Problem is one problem document. Type is derived from Code.
type Problem struct {
	Type      string `json:"type"`
	Title     string `json:"title"`
	Status    int    `json:"status"`
	Code      string `json:"code"`
	Detail    string `json:"detail,omitempty"`
	RequestID string `json:"request_id,omitempty"`
	// Extensions are extra members, written beside the standard ones.
	Extensions map[string]any `json:"-"`
}

// New returns a problem for status with a stable code and a human detail.
func New(status int, code, detail string) Problem {
	return Problem{Type: "urn:idemarchive:problem:" + code, Title: http.StatusText(status), Status: status, Code: code, Detail: detail}
}

// With returns p with an extension member set.
func (p Problem) With(name string, value any) Problem {
	ext := make(map[string]any, len(p.Extensions)+1)
	for k, v := range p.Extensions {
		ext[k] = v
	}
	ext[name] = value
	p.Extensions = ext
	return p
}

// MarshalJSON writes the standard members and the extensions side by side.
func (p Problem) MarshalJSON() ([]byte, error) {
	type plain Problem
	if len(p.Extensions) == 0 {
		return json.Marshal(plain(p))
	}
	doc := make(map[string]any, len(p.Extensions)+6)
	for k, v := range p.Extensions {
		doc[k] = v
	}
	std, err := json.Marshal(plain(p))
	if err != nil {
		return nil, err
	}
	var members map[string]any
	if err := json.Unmarshal(std, &members); err != nil {
		return nil, err
	}
	for k, v := range members {
		doc[k] = v
	}
	return json.Marshal(doc)
}

// Write sends p as the response.
func Write(w http.ResponseWriter, p Problem) {
	body, err := json.Marshal(p)
	if err != nil {
		body = []byte(`{"type":"urn:idemarchive:problem:internal_error","title":"Internal Server Error","status":500,"code":"internal_error"}`)
		p.Status = http.StatusInternalServerError
	}
	w.Header().Set("Content-Type", ContentType)
	w.WriteHeader(p.Status)
	_, _ = w.Write(body)
}
