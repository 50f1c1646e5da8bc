// Package metrics writes CloudWatch metrics in the Embedded Metric Format (EMF):
// one JSON object per line, which CloudWatch Logs turns into metrics when the
// line reaches a Lambda function's log stream. No metrics API is called, so
// emitting costs a write to a buffer and never a network round trip.
//
// The names of the runbook's observability checklist are defined here once;
// the CDK stack reads Checklist to build its alarms.
//
//	m := metrics.New(os.Stdout, "IdempotencyArchive")
//	m.Emit(metrics.Count(metrics.ArchivedTotal, 1200), metrics.Count(metrics.ExpiredBacklog, 0))
//
// A nil *Emitter is valid and discards everything.
package metrics

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"sync"
	"time"
)

// The six metric names of the runbook's checklist, verbatim.
const (
	ExpiredBacklog             = "idempotency_expired_backlog"
	ArchivedTotal              = "idempotency_archived_total"
	ArchiveNewestPartitionDays = "idempotency_archive_newest_partition_days"
	ExpiredReplayTotal         = "idempotency_expired_replay_total"
	ArchiveLookupDurationMs    = "idempotency_archive_lookup_duration_ms"
	ArchiveBytes               = "idempotency_archive_bytes"
)

// ArchiveRows is emitted beside ArchiveBytes so that bytes per row can be
// alarmed on with metric math (the runbook models about 110 bytes per row).
const ArchiveRows = "idempotency_archive_rows"

// ArchiveUncompactedPartitions counts closed partitions the partition
// manager has not compacted yet, emitted by runs that compact.
const ArchiveUncompactedPartitions = "idempotency_archive_uncompacted_partitions"

// DefaultNamespace is the CloudWatch namespace used when none is configured.
const DefaultNamespace = "IdempotencyArchive"

// MaxNamespaceLen is the longest namespace CloudWatch accepts.
const MaxNamespaceLen = 255

// ValidateNamespace reports why CloudWatch would not take namespace; an empty
// one means DefaultNamespace and is valid. CloudWatch drops the metrics of an
// EMF line whose namespace it rejects without a word, so the check runs at
// start. The rules are CloudWatch's: 1 to 255 characters of 0-9A-Za-z and
// . - _ / # : (the set the EMF client libraries enforce too; no spaces), not
// starting with a colon, and not in the AWS/ namespaces reserved for AWS
// services.
func ValidateNamespace(namespace string) error {
	if namespace == "" {
		return nil
	}
	if len(namespace) > MaxNamespaceLen {
		return fmt.Errorf("CloudWatch namespace is %d characters long; at most %d", len(namespace), MaxNamespaceLen)
	}
	for i, r := range namespace {
		ok := r >= '0' && r <= '9' || r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || strings.ContainsRune(".-_/#:", r)
		if !ok {
			return fmt.Errorf("CloudWatch namespace %q has %q at byte %d: use only letters, digits and . - _ / # :", namespace, r, i)
		}
	}
	if namespace[0] == ':' {
		return fmt.Errorf("CloudWatch namespace %q starts with a colon", namespace)
	}
	if strings.HasPrefix(namespace, "AWS/") {
		return fmt.Errorf("CloudWatch namespace %q is in AWS/, reserved for AWS services", namespace)
	}
	return nil
}

// Unit is a CloudWatch metric unit.
type Unit string

// Units used by this project.
const (
	UnitCount        Unit = "Count"
	UnitMilliseconds Unit = "Milliseconds"
	UnitBytes        Unit = "Bytes"
	UnitNone         Unit = "None"
)

// Definition describes one metric of the checklist: what it is and when the
// runbook says to alarm on it.
type Definition struct {
	Name        string
	Unit        Unit
	Description string
}

// Checklist lists the runbook's observability checklist, in its order.
var Checklist = []Definition{
	{ExpiredBacklog, UnitCount, "Live rows past expiry. Alert above 100,000: the leading indicator of vacuum trouble."},
	{ArchivedTotal, UnitCount, "Rows moved per sweep. A flat line while the backlog grows means the sweeper is wedged."},
	{ArchiveNewestPartitionDays, UnitNone, "Days until the newest partition's upper bound. Page below 30."},
	{ExpiredReplayTotal, UnitCount, "409 idempotency_key_expired responses: clients retrying past the window."},
	{ArchiveLookupDurationMs, UnitMilliseconds, "Archive point lookup latency. Alert if p99 exceeds 5 ms."},
	{ArchiveBytes, UnitBytes, "Total archive size. Growth well above 110 bytes per row means a column crept in."},
}

// Value is one metric value in an EMF line.
type Value struct {
	Name  string
	Unit  Unit
	Value float64
}

// Count returns a Value with unit Count.
func Count(name string, v int64) Value { return Value{Name: name, Unit: UnitCount, Value: float64(v)} }

// Milliseconds returns a Value with unit Milliseconds for the duration d.
func Milliseconds(name string, d time.Duration) Value {
	return Value{Name: name, Unit: UnitMilliseconds, Value: float64(d.Microseconds()) / 1000}
}

// Emitter writes EMF lines to a writer. It is safe for concurrent use.
type Emitter struct {
	mu        sync.Mutex
	w         io.Writer
	namespace string
	now       func() time.Time
}

// New returns an Emitter writing to w under the namespace (DefaultNamespace
// when empty). In Lambda, w is os.Stdout; a CLI passes io.Discard or stderr to
// keep its stdout for its own output.
func New(w io.Writer, namespace string) *Emitter {
	if namespace == "" {
		namespace = DefaultNamespace
	}
	return &Emitter{w: w, namespace: namespace, now: time.Now}
}

type emfMetric struct {
	Name string `json:"Name"`
	Unit Unit   `json:"Unit,omitempty"`
}

type emfDirective struct {
	Namespace  string      `json:"Namespace"`
	Dimensions [][]string  `json:"Dimensions"`
	Metrics    []emfMetric `json:"Metrics"`
}

type emfMeta struct {
	Timestamp         int64          `json:"Timestamp"`
	CloudWatchMetrics []emfDirective `json:"CloudWatchMetrics"`
}

// Emit writes the values as one EMF line. The metrics carry no dimensions, so
// an alarm addresses them by namespace and name alone. Write errors are
// dropped: losing a metric line must never fail the work it describes. A
// value JSON cannot hold (NaN, ±Inf) is left out, so that the others are
// still written (with it, the line would not encode at all), as is one
// named "_aws", the line's metadata. A name given twice is written once,
// with its last value and unit: CloudWatch refuses a line whose directive
// names a metric twice.
func (e *Emitter) Emit(values ...Value) {
	if e == nil || len(values) == 0 {
		return
	}
	doc := make(map[string]any, len(values)+1)
	directive := emfDirective{Namespace: e.namespace, Dimensions: [][]string{{}}}
	for _, v := range values {
		// As JSON writes it: two names that differ in bytes that are not
		// UTF-8 are one name on the line.
		v.Name = strings.ToValidUTF8(v.Name, "\uFFFD")
		if math.IsNaN(v.Value) || math.IsInf(v.Value, 0) || v.Name == "_aws" {
			continue
		}
		if _, twice := doc[v.Name]; twice {
			directive.Metrics = slices.DeleteFunc(directive.Metrics, func(m emfMetric) bool { return m.Name == v.Name })
		}
		directive.Metrics = append(directive.Metrics, emfMetric{Name: v.Name, Unit: v.Unit})
		doc[v.Name] = v.Value
	}
	if len(directive.Metrics) == 0 {
		return
	}
	doc["_aws"] = emfMeta{Timestamp: e.now().UnixMilli(), CloudWatchMetrics: []emfDirective{directive}}
	line, err := json.Marshal(doc)
	if err != nil {
		return
	}
	line = append(line, '\n')
	e.mu.Lock()
	defer e.mu.Unlock()
	_, _ = e.w.Write(line)
}
