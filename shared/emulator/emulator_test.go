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
// invocations would go to that other process. That process most often
// listens on every address (net.Listen("tcp", ":0") is [::], in
// /proc/net/tcp6), which a dial to 127.0.0.1 reaches too.
func TestAnEmulatorThatLostItsPortIsNotStarted(t *testing.T) {
	for _, tc := range []struct{ network, host string }{{"tcp", "127.0.0.1"}, {"tcp", ""}, {"tcp4", "0.0.0.0"}} {
		t.Run(tc.network+"/"+tc.host, func(t *testing.T) {
			dir := t.TempDir()
			path := func(name string) string { return filepath.Join(dir, name) }
			// A stand-in for aws-lambda-rie: it names its address, and once
			// the readiness dial has reached the process that took it,
			// exits as the emulator does when it cannot bind. The dial is
			// marked per port: a mark left by an attempt whose stand-in
			// was killed before it read it must not end the next one's
			// before the other process took its port.
			rie := path("rie")
			script := `#!/bin/sh
echo "$2" > "` + path("addr.tmp") + `" && mv "` + path("addr.tmp") + `" "` + path("addr") + `"
dialed="` + path("dialed-") + `${2##*:}"
while [ ! -f "$dialed" ]; do sleep 0.01; done
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
					_, port, _ := net.SplitHostPort(strings.TrimSpace(string(b)))
					l, err := net.Listen(tc.network, net.JoinHostPort(tc.host, port))
					if err != nil {
						t.Errorf("take the emulator's port: %v", err)
						return
					}
					taken++
					go func() {
						defer l.Close()
						if c, err := l.Accept(); err == nil {
							c.Close()
							_ = os.WriteFile(path("dialed-"+port), nil, 0o644)
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
		})
	}
}

// listens tells this process's listening socket from another process's, on
// 127.0.0.1 or on every address (IPv4 or IPv6).
func TestListensKnowsWhoseSocketItIs(t *testing.T) {
	other := exec.Command("sleep", "30")
	require.NoError(t, other.Start())
	defer func() { _ = other.Process.Kill(); _ = other.Wait() }()

	for _, tc := range []struct{ network, addr string }{{"tcp", "127.0.0.1:0"}, {"tcp", ":0"}, {"tcp4", "0.0.0.0:0"}, {"tcp6", "[::]:0"}} {
		l, err := net.Listen(tc.network, tc.addr)
		require.NoError(t, err)
		_, port, _ := net.SplitHostPort(l.Addr().String())
		at := net.JoinHostPort("127.0.0.1", port)
		if tc.network == "tcp6" {
			// An IPv6-only socket is not reached at 127.0.0.1 when
			// bindv6only is set; either way it is not another's.
			owns, known := listens(other.Process.Pid, at)
			require.False(t, owns && known, tc.addr)
			l.Close()
			continue
		}
		owns, known := listens(os.Getpid(), at)
		require.True(t, known, "%s: Linux's /proc says whose socket it is", tc.addr)
		require.True(t, owns, tc.addr)
		owns, known = listens(other.Process.Pid, at)
		require.True(t, known, tc.addr)
		require.False(t, owns, "%s: a socket of this process taken for another's", tc.addr)
		l.Close()
	}
}
