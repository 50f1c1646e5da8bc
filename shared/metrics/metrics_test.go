package metrics

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestEmitWritesOneEMFLine(t *testing.T) {
	var buf bytes.Buffer
	e := New(&buf, "")
	e.now = func() time.Time { return time.UnixMilli(1764669600000) }
	e.Emit(Count(ArchivedTotal, 12), Milliseconds(ArchiveLookupDurationMs, 1500*time.Microsecond))

	if strings.Count(buf.String(), "\n") != 1 || !strings.HasSuffix(buf.String(), "\n") {
		t.Fatalf("want exactly one line, got %q", buf.String())
	}
	var doc struct {
		AWS struct {
			Timestamp         int64
			CloudWatchMetrics []struct {
				Namespace  string
				Dimensions [][]string
				Metrics    []struct{ Name, Unit string }
			}
		} `json:"_aws"`
		Archived float64 `json:"idempotency_archived_total"`
		Lookup   float64 `json:"idempotency_archive_lookup_duration_ms"`
	}
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	d := doc.AWS.CloudWatchMetrics[0]
	if doc.AWS.Timestamp != 1764669600000 || d.Namespace != DefaultNamespace || len(d.Dimensions) != 1 || len(d.Dimensions[0]) != 0 {
		t.Fatalf("bad metadata: %+v", doc.AWS)
	}
	if len(d.Metrics) != 2 || d.Metrics[0].Name != ArchivedTotal || d.Metrics[0].Unit != "Count" || d.Metrics[1].Unit != "Milliseconds" {
		t.Fatalf("bad metric definitions: %+v", d.Metrics)
	}
	if doc.Archived != 12 || doc.Lookup != 1.5 {
		t.Fatalf("bad values: %+v", doc)
	}
}

func TestNilEmitterAndNoValuesWriteNothing(t *testing.T) {
	var e *Emitter
	e.Emit(Count(ArchivedTotal, 1)) // must not panic
	var buf bytes.Buffer
	New(&buf, "x").Emit()
	if buf.Len() != 0 {
		t.Fatalf("wrote %q", buf.String())
	}
}

func TestConcurrentEmitsNeverInterleave(t *testing.T) {
	var buf bytes.Buffer
	e := New(&buf, "x")
	var wg sync.WaitGroup
	for range 50 {
		wg.Add(1)
		go func() { defer wg.Done(); e.Emit(Count(ExpiredReplayTotal, 1)) }()
	}
	wg.Wait()
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if !json.Valid([]byte(line)) {
			t.Fatalf("invalid line %q", line)
		}
	}
}

func TestChecklistHasTheRunbooksSixNames(t *testing.T) {
	want := []string{
		"idempotency_expired_backlog", "idempotency_archived_total", "idempotency_archive_newest_partition_days",
		"idempotency_expired_replay_total", "idempotency_archive_lookup_duration_ms", "idempotency_archive_bytes",
	}
	if len(Checklist) != len(want) {
		t.Fatalf("checklist has %d entries", len(Checklist))
	}
	for i, d := range Checklist {
		if d.Name != want[i] {
			t.Errorf("checklist[%d] = %q, want %q", i, d.Name, want[i])
		}
	}
}

func TestValidateNamespaceFollowsCloudWatchsRules(t *testing.T) {
	t.Parallel()
	valid := []string{
		"", DefaultNamespace, "Idempotency/Archive", "team-a.payments_v2", "App#1:prod", "aws/lowercase-is-not-reserved",
		strings.Repeat("n", MaxNamespaceLen),
	}
	for _, ns := range valid {
		if err := ValidateNamespace(ns); err != nil {
			t.Errorf("%q: %v", ns, err)
		}
	}
	invalid := map[string]string{
		"AWS/Lambda":                           "reserved",
		"AWS/":                                 "reserved",
		"Idempotency Archive":                  "' '",
		"Idempotency\tArchive":                 `'\t'`,
		"Archive\x00":                          `'\x00'`,
		"Archivé":                              "'é'",
		"Archive,prod":                         "','",
		"Archive*":                             "'*'",
		":Archive":                             "colon",
		strings.Repeat("n", MaxNamespaceLen+1): "256 characters",
	}
	for ns, want := range invalid {
		err := ValidateNamespace(ns)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: want an error saying %s, got %v", ns, want, err)
		}
	}
}

// A value JSON cannot hold (NaN, ±Inf) is left out and the others are
// written: with it, the line would not encode, and every value in it would
// be lost. A line of such values alone is not written.
func TestAValueJSONCannotHoldIsLeftOutNotTheLine(t *testing.T) {
	var buf bytes.Buffer
	e := New(&buf, "x")
	e.Emit(Count(ArchivedTotal, 12), Value{Name: "newest_partition_days", Unit: UnitCount, Value: math.Inf(1)},
		Value{Name: "nan", Value: math.NaN()})
	var doc map[string]any
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatalf("%v: %q", err, buf.String())
	}
	if doc[ArchivedTotal] != 12.0 || doc["newest_partition_days"] != nil || doc["nan"] != nil {
		t.Fatalf("want archived 12 alone, got %v", doc)
	}
	if !strings.Contains(buf.String(), `"Metrics":[{"Name":"idempotency_archived_total","Unit":"Count"}]`) {
		t.Fatalf("the directive names a value that is not there: %s", buf.String())
	}
	buf.Reset()
	e.Emit(Value{Name: "nan", Value: math.NaN()})
	if buf.Len() != 0 {
		t.Fatalf("wrote %q", buf.String())
	}
}

// Every metric the directive names has a number of its own on the line,
// once (CloudWatch drops the line otherwise): a value named "_aws", the
// line's metadata, is left out, and a name given twice is written once with
// its last value and unit.
func TestEveryNamedMetricHasItsOwnNumber(t *testing.T) {
	var buf bytes.Buffer
	e := New(&buf, "x")
	e.Emit(Count("_aws", 1), Count(ArchivedTotal, 1), Value{Name: ArchivedTotal, Unit: UnitNone, Value: 2}, Count(ExpiredBacklog, 0),
		Count("a\xff", 1), Count("a\xfe", 3))
	want := `"Metrics":[{"Name":"idempotency_archived_total","Unit":"None"},{"Name":"` + ExpiredBacklog + `","Unit":"Count"},{"Name":"a` + "\uFFFD" + `","Unit":"Count"}]`
	if !strings.Contains(buf.String(), want) {
		t.Fatalf("want %s in %s", want, buf.String())
	}
	var doc map[string]any
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatalf("%v: %q", err, buf.String())
	}
	if doc[ArchivedTotal] != 2.0 || doc[ExpiredBacklog] != 0.0 || doc["a\ufffd"] != 3.0 {
		t.Fatalf("want archived 2 and backlog 0, got %v", doc)
	}
	if _, ok := doc["_aws"].(map[string]any); !ok {
		t.Fatalf("_aws is not the metadata: %v", doc["_aws"])
	}
}
