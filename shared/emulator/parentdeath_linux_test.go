package emulator

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// An emulator whose starter is killed with SIGKILL (no Close runs) is
// stopped by the kernel, not left running with its function. The starter
// is this test binary again, killed while Start waits for the emulator.
func TestTheEmulatorStopsWithItsStarter(t *testing.T) {
	if rie := os.Getenv("EMULATOR_TEST_STARTER_RIE"); rie != "" {
		_, _ = Start(context.Background(), rie, rie, nil, nil)
		select {}
	}
	dir := t.TempDir()
	rie, pidFile := filepath.Join(dir, "rie"), filepath.Join(dir, "pid")
	// A stand-in for aws-lambda-rie that never listens: it names its pid,
	// then sleeps (as sleep, which SIGTERM ends).
	require.NoError(t, os.WriteFile(rie, []byte("#!/bin/sh\necho $$ > "+pidFile+".tmp && mv "+pidFile+".tmp "+pidFile+"\nexec sleep 600\n"), 0o755))
	starter := exec.Command(os.Args[0], "-test.run=^TestTheEmulatorStopsWithItsStarter$")
	starter.Env = append(os.Environ(), "EMULATOR_TEST_STARTER_RIE="+rie)
	require.NoError(t, starter.Start())
	var pid int
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(pidFile)
		if err == nil {
			pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
		}
		return err == nil
	}, time.Minute, 10*time.Millisecond, "the emulator never started")
	require.NoError(t, starter.Process.Kill())
	_ = starter.Wait()
	require.Eventually(t, func() bool { return !running(pid) }, 30*time.Second, 20*time.Millisecond,
		"the emulator (pid %d) still runs after its starter was killed", pid)
}

// running reports whether pid is a process that has not ended (a zombie,
// which an init that does not reap leaves, has ended).
func running(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}
