package emulator

import (
	"os/exec"
	"syscall"
)

// stopWithParent has the kernel send the emulator SIGTERM, on which it shuts
// its runtime down, when the process that started it dies: a `make invoke`
// or a demo killed with SIGKILL runs no Close, and would leave the emulator
// and the function running. The signal follows the OS thread that started
// the emulator; no goroutine of this module locks one and lets it exit.
func stopWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
}
