package stack

import (
	"testing"
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/jsii-runtime-go"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/settings"
)

// MaxLiveTTL defaults as MAX_LIVE_TTL does in the functions, to
// max(168h, LiveTTL): an operator who sets only liveTtl=336h (two-week
// keys) gets no synth error about a value they never set.
func TestLiveTTLOverAWeekNeedsNoMaxLiveTTL(t *testing.T) {
	live := 14 * 24 * time.Hour
	p := Props{CodeDir: placeholderCode(t), LiveTTL: live}
	_, err := New(awscdk.NewApp(&awscdk.AppProps{Outdir: jsii.String(t.TempDir())}), "Test", p)
	require.NoError(t, err, "liveTtl alone, over a week, is refused at synth")

	b := setup(t, func(p *Props) { p.LiveTTL = live })
	env := b.env(b.functionID(t, "lookup"))
	maxTTL, err := settings.ParseDuration(env["MAX_LIVE_TTL"].(string))
	require.NoError(t, err)
	require.GreaterOrEqual(t, maxTTL, live)
}
