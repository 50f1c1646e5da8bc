package xraytracing

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// deps lists the packages the functions link when built with tags.
func deps(t *testing.T, tags string) []string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	require.NoError(t, err, "this test lists the functions' packages with the go command, which is not on PATH")
	out, err := exec.Command(goTool, "list", "-deps", "-tags", tags, "github.com/idemarchive/idemarchive/functions/...").CombinedOutput()
	require.NoError(t, err, "go list: %s", out)
	return strings.Fields(string(out))
}

// What a notrace build saves: it links neither the X-Ray SDK nor the grpc
// and protobuf its xray package brings, while the default build links all
// three (so that this test cannot pass by listing nothing).
func TestANotraceBuildLinksNoXRay(t *testing.T) {
	linked := func(pkgs []string, prefix string) bool {
		for _, p := range pkgs {
			if strings.HasPrefix(p, prefix) {
				return true
			}
		}
		return false
	}
	traced, untraced := deps(t, "lambda.norpc"), deps(t, "lambda.norpc,notrace")
	for _, prefix := range []string{"github.com/aws/aws-xray-sdk-go/", "google.golang.org/grpc", "google.golang.org/protobuf/"} {
		require.True(t, linked(traced, prefix), "the default build links no %s", prefix)
		require.False(t, linked(untraced, prefix), "a notrace build links %s", prefix)
	}
	require.True(t, linked(untraced, "github.com/idemarchive/idemarchive/shared/tracing"))
}
