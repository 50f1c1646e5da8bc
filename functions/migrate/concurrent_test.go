package main

import (
	"sync"
	"testing"

	"github.com/aws/aws-lambda-go/cfn"
	"github.com/aws/aws-lambda-go/lambda"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/testenv"
)

// concurrentCreates runs copies invocations of each stack's Create event at
// once and requires every one of them to answer SUCCESS.
func concurrentCreates(t *testing.T, stacks, copies int) {
	bundles := make([]bundle, stacks)
	for i := range bundles {
		bundles[i] = setup(t)
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, b := range bundles {
		ev := b.event(t, "migrate-cfn-create.json", nil)
		for range copies {
			env, _, _ := testenv.FunctionEnv(t, b.db, nil)
			h := lambda.NewHandler(lambdaHandler(env))
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				if _, err := h.Invoke(testenv.Invocation("req-"+randomSuffix()), ev); err != nil {
					t.Errorf("stack %d: %v", i, err)
				}
			}()
		}
	}
	close(start)
	wg.Wait()
	for i, b := range bundles {
		b.cfn.mu.Lock()
		got := b.cfn.got
		b.cfn.mu.Unlock()
		require.Len(t, got, copies, "stack %d", i)
		for _, r := range got {
			require.Equal(t, cfn.StatusSuccess, r.Status, "stack %d: %s", i, r.Reason)
		}
	}
}

// CloudFormation's event may reach the function twice at the same time
// (Lambda's asynchronous invocations are at least once). Both answer
// SUCCESS: runs on one schema are serialized for their whole length (on a
// fresh schema one copy's first partition would otherwise race the other's
// roles.sql REVOKE: "tuple concurrently updated").
func TestDuplicateCreateEventsAtOnce(t *testing.T) {
	t.Parallel()
	for range 5 {
		concurrentCreates(t, 1, 2)
	}
}
