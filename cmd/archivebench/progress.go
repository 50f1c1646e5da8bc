package main

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// progress prints what the bench is doing on stderr: one line rewritten in
// place on a terminal, else a line at most every few seconds (and at every
// new step), so that a log stays readable.
type progress struct {
	mu    sync.Mutex
	w     io.Writer
	tty   bool
	step  string
	last  time.Time
	width int
	start time.Time
}

func newProgress(w *os.File) *progress {
	fi, err := w.Stat()
	tty := err == nil && fi.Mode()&os.ModeCharDevice != 0
	return &progress{w: w, tty: tty, start: time.Now()}
}

// Step starts a new step and always prints it.
func (p *progress) Step(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.step = fmt.Sprintf(format, args...)
	p.print(p.step, true)
}

// Update reports progress within the current step; it is throttled.
func (p *progress) Update(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.print(p.step+": "+fmt.Sprintf(format, args...), false)
}

// Done ends the progress line.
func (p *progress) Done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty && p.width > 0 {
		fmt.Fprintln(p.w)
		p.width = 0
	}
}

func (p *progress) print(msg string, force bool) {
	now := time.Now()
	every := 3 * time.Second
	if p.tty {
		every = 200 * time.Millisecond
	}
	if !force && now.Sub(p.last) < every {
		return
	}
	p.last = now
	line := fmt.Sprintf("archivebench [%4.0fs] %s", now.Sub(p.start).Seconds(), msg)
	if !p.tty {
		fmt.Fprintln(p.w, line)
		return
	}
	pad := ""
	if n := p.width - len(line); n > 0 {
		pad = fmt.Sprintf("%*s", n, "")
	}
	fmt.Fprint(p.w, "\r"+line+pad)
	p.width = len(line)
}
