//go:build !linux

package emulator

import "os/exec"

// stopWithParent: only Linux can tie a child's life to its parent's; the
// emulator itself runs only there.
func stopWithParent(*exec.Cmd) {}
