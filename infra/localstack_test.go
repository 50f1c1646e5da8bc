package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/idemarchive/idemarchive/infra/stack"
)

// Docker is not available where the tests run, so these check what can be
// checked without it: the compose file, the scripts' syntax, and that the
// template deploy.sh deploys is one the stack's tests cover.

func TestComposeFileParses(t *testing.T) {
	// GIVEN the compose file
	raw, err := os.ReadFile("../localstack/compose.yaml")
	require.NoError(t, err)
	var compose struct {
		Services map[string]struct {
			Image       string
			Environment map[string]string
			Ports       []string
			Volumes     []string
			Healthcheck struct{ Test []string }
		}
		Volumes map[string]any
	}
	// THEN it is YAML of the compose shape, with one LocalStack service ...
	require.NoError(t, yaml.Unmarshal(raw, &compose))
	ls, ok := compose.Services["localstack"]
	require.True(t, ok, "service localstack")
	require.True(t, strings.HasPrefix(ls.Image, "localstack/localstack:"), ls.Image)
	// ... that refuses to start without an auth token, as LocalStack does
	require.Contains(t, ls.Environment["LOCALSTACK_AUTH_TOKEN"], "${LOCALSTACK_AUTH_TOKEN:?")
	// ... listens on loopback only, runs Lambda containers through docker
	require.Contains(t, ls.Ports, "127.0.0.1:4566:4566")
	for _, p := range ls.Ports {
		require.True(t, strings.HasPrefix(p, "127.0.0.1:"), "port %s bound beyond loopback", p)
	}
	require.Contains(t, ls.Volumes, "/var/run/docker.sock:/var/run/docker.sock")
	// ... and has the health check deploy.sh and --wait rely on
	require.Contains(t, strings.Join(ls.Healthcheck.Test, " "), "/_localstack/health")
	for _, v := range ls.Volumes {
		if name, _, ok := strings.Cut(v, ":"); ok && !strings.HasPrefix(name, "/") && !strings.HasPrefix(name, ".") {
			require.Contains(t, compose.Volumes, name, "named volume %s is declared", name)
		}
	}
}

func TestScriptsPassBashSyntaxCheck(t *testing.T) {
	bash, err := exec.LookPath("bash")
	require.NoError(t, err, "bash is needed to check the scripts")
	scripts, err := filepath.Glob("../localstack/*.sh")
	require.NoError(t, err)
	scripts = append(scripts, "ensure-node.sh")
	require.GreaterOrEqual(t, len(scripts), 2)
	for _, s := range scripts {
		// GIVEN each script, THEN bash -n parses it and it is executable
		out, err := exec.Command(bash, "-n", s).CombinedOutput()
		require.NoError(t, err, "%s: %s", s, out)
		info, err := os.Stat(s)
		require.NoError(t, err)
		require.NotZero(t, info.Mode()&0o111, "%s is executable", s)
	}
}

func TestLocalStackDeploysTheTestedTemplate(t *testing.T) {
	// GIVEN the context deploy.sh synthesizes with
	raw, err := os.ReadFile("../localstack/context.json")
	require.NoError(t, err)
	var ctx map[string]any
	require.NoError(t, json.Unmarshal(raw, &ctx))
	deploy, err := os.ReadFile("../localstack/deploy.sh")
	require.NoError(t, err)
	require.Contains(t, string(deploy), `CDK_CONTEXT_JSON="$(cat ../localstack/context.json)"`, "deploy.sh synthesizes with context.json")
	require.Contains(t, string(deploy), `--app "${ASSEMBLY}"`, "deploy.sh deploys what it synthesized, not a fresh synth")

	// THEN those props are the "localstack" case the stack's cdk-nag test
	// runs, and the CDK can build them
	p, name, err := propsFromContext(contextOf(ctx))
	require.NoError(t, err)
	require.Equal(t, DefaultStackName, name)
	require.False(t, *p.RotateMasterSecret, "LocalStack has no Serverless Application Repository for the rotation function")
	require.False(t, *p.DeletionProtection, "a LocalStack stack is thrown away")

	code := t.TempDir()
	for _, fn := range stack.FunctionNames {
		require.NoError(t, os.WriteFile(filepath.Join(code, fn+".zip"), []byte(fn), 0o644))
	}
	ctx["codeDir"] = code
	out := t.TempDir()
	require.NoError(t, run(out, ctx))
	tpl, err := os.ReadFile(filepath.Join(out, DefaultStackName+".template.json"))
	require.NoError(t, err)
	require.NotContains(t, string(tpl), "AWS::Serverless::Application")
	require.NotContains(t, string(tpl), `"Transform"`)
}
