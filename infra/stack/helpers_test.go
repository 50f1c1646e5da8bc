package stack

// The CDK tests do not call t.Parallel: every call goes through the one jsii
// kernel process of the test binary, so parallel tests would only interleave.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"
	"github.com/aws/jsii-runtime-go"
	"github.com/stretchr/testify/require"
)

// placeholderCode writes a tiny zip per function into a temporary directory,
// so that the tests do not need `make build` (assets are only hashed and
// staged, never run).
func placeholderCode(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, fn := range FunctionNames {
		require.NoError(t, os.WriteFile(filepath.Join(dir, fn+".zip"), []byte("placeholder "+fn), 0o644))
	}
	return dir
}

// bundle is what a test inspects: the stack, its template through the
// assertions API, and the same template as plain JSON for loops over
// resources.
type bundle struct {
	stack    *Stack
	template assertions.Template
	json     template
}

type template struct {
	Resources map[string]resource
	Outputs   map[string]struct{ Value any }
}

type resource struct {
	Type       string
	Properties map[string]any
}

// setup synthesizes the stack with the props mutate sets.
func setup(t *testing.T, mutate func(*Props)) bundle {
	t.Helper()
	return setupWith(t, mutate, nil)
}

// setupWith is setup that lets extend add to the stack before it is
// synthesized (the construct tree is frozen after).
func setupWith(t *testing.T, mutate func(*Props), extend func(*Stack)) bundle {
	t.Helper()
	p := Props{CodeDir: placeholderCode(t)}
	if mutate != nil {
		mutate(&p)
	}
	app := awscdk.NewApp(&awscdk.AppProps{Outdir: jsii.String(t.TempDir())})
	s, err := New(app, "Test", p)
	require.NoError(t, err)
	if extend != nil {
		extend(s)
	}
	tpl := assertions.Template_FromStack(s.Stack, nil)
	raw, err := json.Marshal(tpl.ToJSON())
	require.NoError(t, err)
	var doc template
	require.NoError(t, json.Unmarshal(raw, &doc))
	return bundle{stack: s, template: tpl, json: doc}
}

// ofType returns the logical ids and resources of a type, sorted by id.
func (b bundle) ofType(typ string) map[string]resource {
	out := map[string]resource{}
	for id, r := range b.json.Resources {
		if r.Type == typ {
			out[id] = r
		}
	}
	return out
}

// functionID returns the logical id of the named function, found by its
// description: ids are hashed, so tests find resources by what they are.
func (b bundle) functionID(t *testing.T, name string) string {
	t.Helper()
	var ids []string
	for id, r := range b.ofType("AWS::Lambda::Function") {
		if d, _ := r.Properties["Description"].(string); strings.HasPrefix(d, functionDescriptions[name]) {
			ids = append(ids, id)
		}
	}
	require.Len(t, ids, 1, "exactly one %s function", name)
	return ids[0]
}

var functionDescriptions = map[string]string{
	"sweep":      "Moves expired idempotency keys",
	"partitions": "Creates archive partitions",
	"lookup":     "Answers archive lookups",
	"migrate":    "CloudFormation custom resource",
}

// getAtt is the {"Fn::GetAtt": [id, attr]} a reference to id's attribute
// synthesizes to.
func getAtt(id, attr string) map[string]any {
	return map[string]any{"Fn::GetAtt": []any{id, attr}}
}

// actions lists the actions of a policy statement (a string or a list).
func actions(stmt map[string]any) []string {
	switch a := stmt["Action"].(type) {
	case string:
		return []string{a}
	case []any:
		var out []string
		for _, v := range a {
			out = append(out, v.(string))
		}
		slices.Sort(out)
		return out
	}
	return nil
}

// statements returns the statements of every AWS::IAM::Policy attached to
// the role with logical id roleID.
func (b bundle) statements(roleID string) []map[string]any {
	var out []map[string]any
	for _, r := range b.ofType("AWS::IAM::Policy") {
		attached := false
		for _, role := range r.Properties["Roles"].([]any) {
			if ref, _ := role.(map[string]any)["Ref"].(string); ref == roleID {
				attached = true
			}
		}
		if !attached {
			continue
		}
		doc := r.Properties["PolicyDocument"].(map[string]any)
		for _, s := range doc["Statement"].([]any) {
			out = append(out, s.(map[string]any))
		}
	}
	return out
}

// roleOf returns the logical id of a function's execution role.
func (b bundle) roleOf(t *testing.T, functionID string) string {
	t.Helper()
	role := b.json.Resources[functionID].Properties["Role"].(map[string]any)["Fn::GetAtt"].([]any)
	return role[0].(string)
}

// env returns a function's environment variables (values that are tokens are
// left as their JSON).
func (b bundle) env(functionID string) map[string]any {
	return b.json.Resources[functionID].Properties["Environment"].(map[string]any)["Variables"].(map[string]any)
}

// flatten renders a CloudFormation value (a string or an Fn::Join of parts)
// as text, with references as {Ref} / {GetAtt}: enough to read what an ARN
// or URL is made of.
func flatten(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case map[string]any:
		if j, ok := x["Fn::Join"].([]any); ok {
			var parts []string
			for _, p := range j[1].([]any) {
				parts = append(parts, flatten(p))
			}
			return strings.Join(parts, j[0].(string))
		}
		b, _ := json.Marshal(x)
		return string(b)
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// rotationSG returns the logical id of the rotation function's security group.
func (b bundle) rotationSG(t *testing.T) string {
	t.Helper()
	var ids []string
	for id, r := range b.ofType("AWS::EC2::SecurityGroup") {
		if strings.HasPrefix(fmt.Sprint(r.Properties["GroupDescription"]), "Master password rotation") {
			ids = append(ids, id)
		}
	}
	require.Len(t, ids, 1)
	return ids[0]
}
