package partition_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/partition"
	"github.com/idemarchive/idemarchive/shared/verify"
)

// verify, ListUnrecorded and a dry run go on while another session attaches
// and drops months. A table being attached was listed before its bound
// (read NULL: "cannot scan NULL into *string"), and reading the definition
// of a trigger whose table is being dropped fails ("could not open
// relation"): neither may fail them.
func TestChecksGoOnWhileMonthsAreAttachedAndDropped(t *testing.T) {
	t.Parallel()
	db, m := managedArchive(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ctx.Err() == nil; i++ {
			n := fmt.Sprintf("rt_drop_%d", i)
			_, err := db.Pool.Exec(context.Background(), fmt.Sprintf(`CREATE TABLE %[1]s (LIKE idempotency_key_archive INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
				ALTER TABLE idempotency_key_archive ATTACH PARTITION %[1]s FOR VALUES FROM ('2030-01-01') TO ('2030-02-01');
				SELECT idempotency_archive_partition_triggers('%[1]s'::regclass)`, n))
			if err != nil {
				t.Logf("creator: %v", err)
				return
			}
			_, err = db.Pool.Exec(context.Background(), fmt.Sprintf(`DROP TABLE %s`, n))
			if err != nil {
				t.Logf("dropper: %v", err)
				return
			}
		}
	}()
	errs := map[string]int{}
	n := 0
	for ctx.Err() == nil {
		n++
		if _, err := partition.ListUnrecorded(context.Background(), db.Pool); err != nil {
			errs["list: "+err.Error()]++
		}
		checks, err := verify.Run(context.Background(), db.Pool, verify.Options{Now: at(decNow)})
		if err != nil {
			errs["verify: "+err.Error()]++
		}
		for _, c := range checks {
			if !c.Pass && strings.Contains(strings.ToLower(c.Figure+c.Name), "oid") {
				errs["check: "+c.Name+": "+c.Figure]++
			}
		}
		if _, err := m.Run(context.Background(), true); err != nil {
			errs["dryrun: "+err.Error()]++
		}
	}
	wg.Wait()
	require.Empty(t, errs, "in %d rounds", n)
}
