// Package emulator runs a Lambda bootstrap binary under the AWS Lambda Runtime
// Interface Emulator (aws-lambda-rie) on this machine, without docker, and
// invokes it over HTTP the way the Lambda Invoke API does. `make invoke` and
// the emulator tests use it.
//
//	e, err := emulator.Start(ctx, "bin/tools/aws-lambda-rie", "bin/local/lookup/bootstrap", env)
//	defer e.Close()
//	out, err := e.Invoke(ctx, payload)
package emulator

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Module is the emulator's Go module, pinned; install it with
// go install Module.
const Module = "github.com/aws/aws-lambda-runtime-interface-emulator/cmd/aws-lambda-rie@v0.0.0-20261030222936-bef5c4ba774d"

// InvokePath is the Lambda Invoke API path the emulator serves.
const InvokePath = "/2015-03-31/functions/function/invocations"

// Emulator is one bootstrap running under the emulator.
type Emulator struct {
	// URL is the base URL of the emulator's Invoke API.
	URL string
	// Output is what the emulator and the function printed (logs, EMF).
	Output *Buffer

	cmd    *exec.Cmd
	exited chan struct{} // closed when the emulator process has exited
}

// Buffer is a bytes.Buffer safe for concurrent writers.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// DefaultTimeoutSeconds is the function's timeout under the emulator unless
// env sets AWS_LAMBDA_FUNCTION_TIMEOUT (whole seconds).
const DefaultTimeoutSeconds = 120

// Start runs bootstrap under the emulator at rie, with env as the function's
// whole environment (plus PATH and HOME), and waits until it listens. Output
// is also copied to mirror when it is not nil. Ports are picked free just
// before the start; if another process takes one first and the emulator
// exits, Start tries again with new ports.
func Start(ctx context.Context, rie, bootstrap string, env map[string]string, mirror io.Writer) (*Emulator, error) {
	for _, p := range []string{rie, bootstrap} {
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("emulator: %w", err)
		}
	}
	var err error
	for range 3 {
		var e *Emulator
		if e, err = start(ctx, rie, bootstrap, env, mirror); err == nil {
			return e, nil
		}
		if ctx.Err() != nil {
			break
		}
	}
	return nil, err
}

func start(ctx context.Context, rie, bootstrap string, env map[string]string, mirror io.Writer) (*Emulator, error) {
	apiAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	rieAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(rie, "--runtime-interface-emulator-address", rieAddr, "--runtime-api-address", apiAddr, bootstrap)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "AWS_LAMBDA_FUNCTION_TIMEOUT=" + strconv.Itoa(DefaultTimeoutSeconds)}
	for k, v := range env { // later values win: env's timeout, if given
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	e := &Emulator{URL: "http://" + rieAddr, Output: &Buffer{}, cmd: cmd, exited: make(chan struct{})}
	var out io.Writer = e.Output
	if mirror != nil {
		out = io.MultiWriter(e.Output, mirror)
	}
	cmd.Stdout, cmd.Stderr = out, out
	stopWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start emulator: %w", err)
	}
	go func() {
		_ = cmd.Wait()
		close(e.exited)
	}()
	for {
		c, err := net.DialTimeout("tcp", rieAddr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			// Someone listens, but maybe not the emulator: a process that
			// took the port between freeAddr and the emulator's bind, when
			// the emulator exits (it cannot listen). Taken for it, that
			// process would get every invocation meant for the function.
			if owns, known := listens(cmd.Process.Pid, rieAddr); known {
				if owns {
					return e, nil
				}
				e.Close()
				return nil, fmt.Errorf("emulator could not listen on %s (another process listens there):\n%s", rieAddr, e.Output.String())
			}
			// Without /proc to say whose socket it is, give an emulator
			// that could not bind the time to exit.
			select {
			case <-e.exited:
				return nil, fmt.Errorf("emulator exited while starting on %s (another process listens there):\n%s", rieAddr, e.Output.String())
			case <-time.After(bindSettle):
				return e, nil
			}
		}
		select {
		case <-e.exited:
			if strings.Contains(e.Output.String(), "address already in use") {
				// Its bind failed: a dial to the address may well have
				// reached the other process and timed out all the same, on
				// a loaded machine, before it could say so.
				return nil, fmt.Errorf("emulator exited while starting on %s (another process listens there):\n%s", rieAddr, e.Output.String())
			}
			return nil, fmt.Errorf("emulator exited while starting on %s:\n%s", rieAddr, e.Output.String())
		case <-ctx.Done():
			e.Close()
			return nil, fmt.Errorf("emulator did not listen on %s: %w\n%s", rieAddr, ctx.Err(), e.Output.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// bindSettle is how long Start waits, where /proc cannot say whose socket
// answers at the emulator's address, for an emulator that could not bind it
// to exit.
const bindSettle = 150 * time.Millisecond

// listens reports whether process pid holds the socket listening on addr
// (127.0.0.1:port), from Linux's /proc; known is false where /proc cannot
// say (another system). The socket a dial to 127.0.0.1 reaches is the one
// bound to 127.0.0.1 itself, or else one bound to every address: 0.0.0.0 in
// /proc/net/tcp, or :: (which takes IPv4 too) or ::ffff:127.0.0.1 in
// /proc/net/tcp6. The process that took the emulator's port most often
// holds one of the latter (net.Listen("tcp", ":0") is ::), so they are read
// too: taken for a table this code cannot read, they left Start to guess.
func listens(pid int, addr string) (owns, known bool) {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return false, false
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return false, false
	}
	// local_address is hex, PORT after the colon; st 0A is LISTEN.
	suffix := fmt.Sprintf(":%04X", p)
	loopback := map[string]bool{"0100007F" + suffix: true}
	wildcard := map[string]bool{
		"00000000" + suffix:                         true,
		"00000000000000000000000000000000" + suffix: true,
		"0000000000000000FFFF00000100007F" + suffix: true,
	}
	var specific, every []string // inodes of the sockets a dial may reach
	read := false
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(table)
		if err != nil {
			continue // no IPv6 here, say
		}
		read = true
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			switch {
			case len(f) <= 9 || f[3] != "0A":
			case loopback[f[1]]:
				specific = append(specific, f[9])
			case wildcard[f[1]]:
				every = append(every, f[9])
			}
		}
	}
	if len(specific) == 0 {
		specific = every
	}
	if !read || len(specific) == 0 {
		return false, false // the dial reached it: a table this code misreads
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return false, false
	}
	for _, fd := range fds {
		target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err != nil {
			continue
		}
		for _, inode := range specific {
			if target == "socket:["+inode+"]" {
				return true, true
			}
		}
	}
	return false, true
}

// Invoke posts payload and returns the function's response payload.
func (e *Emulator) Invoke(ctx context.Context, payload []byte) ([]byte, error) {
	select {
	case <-e.exited:
		// Whatever answers at its address now is not this function.
		return nil, fmt.Errorf("invoke: the emulator has exited:\n%s", e.Output.String())
	default:
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.URL+InvokePath, bytes.NewReader(payload))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("invoke: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("invoke: read response: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return body, fmt.Errorf("invoke: emulator answered %s: %s", resp.Status, body)
	}
	return body, nil
}

// Close stops the emulator and the function: SIGTERM, as Lambda sends on
// shutdown (the functions close their pools on it), then SIGKILL after 3s.
func (e *Emulator) Close() {
	select {
	case <-e.exited:
		return
	default:
	}
	_ = e.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-e.exited:
	case <-time.After(3 * time.Second):
		_ = e.cmd.Process.Kill()
		<-e.exited
	}
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", errors.New("emulator: no free local port")
	}
	defer l.Close()
	return l.Addr().String(), nil
}
