package emulator

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Another process may take the emulator's port between the moment Start
// picks it and the emulator's bind: the emulator exits, and the port
// answers all the same. Start must not hand back an emulator whose
// invocations would go to that other process.
func TestAnEmulatorThatLostItsPortIsNotStarted(t *testing.T) {
	dir := t.TempDir()
	path := func(name string) string { return filepath.Join(dir, name) }
	// A stand-in for aws-lambda-rie: it names its address, and once the
	// readiness dial has reached the process that took it, exits as the
	// emulator does when it cannot bind.
	rie := path("rie")
	script := `#!/bin/sh
echo "$2" > "` + path("addr.tmp") + `" && mv "` + path("addr.tmp") + `" "` + path("addr") + `"
while [ ! -f "` + path("dialed") + `" ]; do sleep 0.01; done
rm -f "` + path("dialed") + `"
echo "listen tcp $2: bind: address already in use" >&2
exit 1
`
	require.NoError(t, os.WriteFile(rie, []byte(script), 0o755))

	// The other process: it takes each address the stand-in names.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	taken := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			b, err := os.ReadFile(path("addr"))
			if err != nil {
				time.Sleep(5 * time.Millisecond)
				continue
			}
			_ = os.Remove(path("addr"))
			l, err := net.Listen("tcp", strings.TrimSpace(string(b)))
			if err != nil {
				t.Errorf("take the emulator's port: %v", err)
				return
			}
			taken++
			go func() {
				defer l.Close()
				if c, err := l.Accept(); err == nil {
					c.Close()
					_ = os.WriteFile(path("dialed"), nil, 0o644)
				}
			}()
		}
	}()

	e, err := Start(ctx, rie, rie, nil, nil)
	cancel()
	<-done
	if e != nil {
		e.Close()
	}
	require.Error(t, err, "an emulator that exited was taken for one that listens")
	require.ErrorContains(t, err, "another process listens there")
	require.Equal(t, 3, taken, "Start tries three times, with new ports")
}

// listens tells this process's listening socket from another process's.
func TestListensKnowsWhoseSocketItIs(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	owns, known := listens(os.Getpid(), l.Addr().String())
	require.True(t, known, "Linux's /proc says whose socket it is")
	require.True(t, owns)

	other := exec.Command("sleep", "30")
	require.NoError(t, other.Start())
	defer func() { _ = other.Process.Kill(); _ = other.Wait() }()
	owns, known = listens(other.Process.Pid, l.Addr().String())
	require.True(t, known)
	require.False(t, owns, "a socket of this process taken for another's")
}
