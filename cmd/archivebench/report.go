package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// report is everything one run measured, with what it ran on.
type report struct {
	Date       string            `json:"date"`
	Command    string            `json:"command"`
	Machine    machine           `json:"machine"`
	GoVersion  string            `json:"go_version"`
	PostgreSQL string            `json:"postgresql"`
	Settings   map[string]string `json:"postgresql_settings"`
	Sizes      sizes             `json:"sizes"`
	Seconds    float64           `json:"seconds"`
	Sweep      *sweepSection     `json:"sweep,omitempty"`
	Traffic    *trafficSection   `json:"traffic,omitempty"`
	Lookup     *lookupSection    `json:"lookup,omitempty"`
	Fresh      *freshSection     `json:"fresh_keys,omitempty"`
	Functions  *functionsSection `json:"functions,omitempty"`
	Compact    *compactSection   `json:"compaction,omitempty"`
}

type machine struct {
	CPU      string `json:"cpu"`
	Cores    int    `json:"cores"`
	MemoryMB int64  `json:"memory_mb"`
	OS       string `json:"os"`
}

// describe records the date, the machine and the server.
func (r *report) describe(ctx context.Context, base string) error {
	r.Date = time.Now().UTC().Format(time.RFC3339)
	r.GoVersion = runtime.Version()
	r.Machine = machine{CPU: cpuModel(), Cores: runtime.NumCPU(), MemoryMB: memoryMB(), OS: runtime.GOOS + "/" + runtime.GOARCH}
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		return fmt.Errorf("connect to DATABASE_URL: %w", err)
	}
	defer conn.Close(ctx)
	if err := conn.QueryRow(ctx, "SELECT version()").Scan(&r.PostgreSQL); err != nil {
		return fmt.Errorf("read the server version: %w", err)
	}
	r.Settings = map[string]string{}
	rows, err := conn.Query(ctx, `SELECT name, setting || coalesce(unit, '') FROM pg_settings
		WHERE name IN ('shared_buffers', 'fsync', 'synchronous_commit', 'full_page_writes', 'wal_level', 'max_wal_size', 'work_mem', 'plan_cache_mode')`)
	if err != nil {
		return fmt.Errorf("read the server settings: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			return fmt.Errorf("read the server settings: %w", err)
		}
		r.Settings[k] = v
	}
	return rows.Err()
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}

func memoryMB() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) >= 2 && fields[0] == "MemTotal:" {
			kb, _ := strconv.ParseInt(fields[1], 10, 64)
			return kb / 1024
		}
	}
	return 0
}

func (r *report) writeJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
