package stack

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/jsii-runtime-go"
	"github.com/stretchr/testify/require"
)

// synth builds the stack and turns a jsii panic into an error.
func synthRecovering(t *testing.T, mutate func(*Props)) (b bundle, err error) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("synth panicked: %v", r)
		}
	}()
	p := Props{CodeDir: placeholderCode(t)}
	mutate(&p)
	app := awscdk.NewApp(&awscdk.AppProps{Outdir: jsii.String(t.TempDir())})
	_, err = New(app, "Test", p)
	if err != nil {
		return b, err
	}
	return setup(t, mutate), nil
}

// A PartitionStatementTimeout that shared/settings accepts (whole
// milliseconds, under 13m) gives the partitions function a whole-second
// timeout that covers it: 3m0.5s passed validate() and then crashed the
// synth inside CDK (Lambda timeouts are whole seconds).
func TestASubSecondPartitionStatementTimeoutSynthesizes(t *testing.T) {
	mutate := func(p *Props) { p.PartitionStatementTimeout = 3*time.Minute + 500*time.Millisecond }
	p := Props{CodeDir: placeholderCode(t)}
	mutate(&p)
	require.NoError(t, p.validate(), "validate accepts it")
	b, err := synthRecovering(t, mutate)
	require.NoError(t, err, "a value validate() accepts must synthesize")
	got := b.json.Resources[b.functionID(t, "partitions")].Properties["Timeout"]
	require.GreaterOrEqual(t, got.(float64), (3*time.Minute + 500*time.Millisecond + partitionsSlack).Seconds())
}

// The manager drops an interrupted rebuild's leftover index with
// statement_timeout = max(lock, statement) (dropLeftovers): a 10m lock
// timeout deployed a 5-minute function whose DDL could run 10 minutes.
func TestThePartitionsTimeoutCoversALongLockTimeout(t *testing.T) {
	p := Props{CodeDir: placeholderCode(t), PartitionLockTimeout: 10 * time.Minute}
	require.NoError(t, p.validate(), "validate accepts it")
	require.Equal(t, 12*time.Minute, p.partitionsTimeout())
	p.PartitionLockTimeout = MaxPartitionStatementTimeout + time.Second
	require.ErrorContains(t, p.validate(), "PartitionLockTimeout must be at most 13m0s")
	p.PartitionLockTimeout = 10 * time.Minute
	longest := max(p.PartitionLockTimeout, 2*time.Minute) // dropIndex's statement_timeout
	require.GreaterOrEqual(t, p.partitionsTimeout(), longest+partitionsSlack,
		"the partitions function (%s) ends before a DDL statement its settings allow (%s)", p.partitionsTimeout(), longest)
}

// Lambda refuses a function whose environment variables total over 4 KB,
// at deploy; SweepResourceIDPath is copied into every function's
// environment, so a path too long is refused at synth.
func TestAResourceIDPathTooLongForLambdaIsRefusedAtSynth(t *testing.T) {
	path := strings.Repeat("a.", 2500) + "id"
	p := Props{CodeDir: placeholderCode(t), SweepResourceIDPath: path}
	require.ErrorContains(t, p.validate(), "over the 3328 Lambda accepts")
	// AND a long path that fits is accepted
	p.SweepResourceIDPath = strings.Repeat("a.", 1000) + "id"
	require.NoError(t, p.validate())
}
