package main

import (
	"context"
	"net"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/testenv"
)

// A busy port is named, with the way out, before make dev starts anything,
// and the API itself says the same if the port is taken later.
func TestABusyPortNamesADDR(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port

	if _, err := exec.LookPath("make"); err != nil {
		t.Fatal("make is not installed: the README's commands need it (apt-get install -y make)")
	}
	cmd := exec.Command("make", "-s", "dev-check", "ADDR=:"+itoa(port))
	cmd.Dir = testenv.RepoRoot(t)
	out, err := cmd.CombinedOutput()
	require.Error(t, err, "%s", out)
	require.Contains(t, string(out), "port "+itoa(port)+" is already in use; choose another: ADDR=:8081 make dev")

	db := dbtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = run(ctx, func(k string) string {
		return map[string]string{"DATABASE_URL": db.URL, "ADDR": "127.0.0.1:" + itoa(port)}[k]
	})
	require.ErrorContains(t, err, "set ADDR, for example ADDR=:8081")
}

func itoa(n int) string { return strconv.Itoa(n) }

// A connection string pasted into another variable is echoed by its error,
// which the API prints as it stops: without its password.
func TestASettingsErrorHidesAPastedPassword(t *testing.T) {
	t.Parallel()
	err := run(context.Background(), func(k string) string {
		return map[string]string{"DATABASE_URL": "postgres://127.0.0.1:1/db", "CLOCK_SKEW": "postgres://app:S3cretPw42@db.example/app"}[k]
	})
	require.ErrorContains(t, err, "CLOCK_SKEW")
	require.NotContains(t, err.Error(), "S3cretPw42")
}
