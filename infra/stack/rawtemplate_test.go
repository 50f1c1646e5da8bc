package stack

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// rawResource is a template resource with the attributes the bundle's
// resource type leaves out (DependsOn, DeletionPolicy).
type rawResource struct {
	Type                string
	DependsOn           []string
	DeletionPolicy      string
	UpdateReplacePolicy string
	Properties          map[string]any
}

// rawResources returns every resource of the bundle's template with its
// attributes.
func rawResources(t *testing.T, b bundle) map[string]rawResource {
	t.Helper()
	raw, err := json.Marshal(b.template.ToJSON())
	require.NoError(t, err)
	var doc struct{ Resources map[string]rawResource }
	require.NoError(t, json.Unmarshal(raw, &doc))
	return doc.Resources
}

// alarmNamed returns the alarm named name.
func alarmNamed(t *testing.T, b bundle, name string) resource {
	t.Helper()
	for _, a := range b.ofType("AWS::CloudWatch::Alarm") {
		if a.Properties["AlarmName"] == name {
			return a
		}
	}
	require.Failf(t, "no alarm", "%s", name)
	return resource{}
}
