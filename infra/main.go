// Command infra synthesizes the idempotency archive's CloudFormation template
// into cdk.out/ (make synth), or serves as the app of the CDK CLI
// (npx aws-cdk@2 deploy, with cdk.json). Props come from CDK context values
// (-c name=value, or cdk.json); see README.md for each.
package main

import (
	"fmt"
	"os"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/jsii-runtime-go"

	"github.com/idemarchive/idemarchive/infra/stack"
)

func main() {
	defer jsii.Close()
	// The CDK CLI names the output directory in CDK_OUTDIR; make synth,
	// which runs without it, writes beside the repository.
	outdir := os.Getenv("CDK_OUTDIR")
	if outdir == "" {
		outdir = "../cdk.out"
	}
	if err := run(outdir, nil); err != nil {
		fmt.Fprintln(os.Stderr, "infra:", err)
		os.Exit(1)
	}
}

// run synthesizes into outdir. context adds to the context the CLI passes
// (cdk.json, -c); tests use it, since the jsii process reads its environment
// once, when the test binary starts.
func run(outdir string, context map[string]any) (err error) {
	// The CDK refuses some values by panicking (an ARN that is none, a
	// construct id): said as an error line, not a goroutine trace.
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("synth: %v", r)
		}
	}()
	ctx := map[string]any{
		// Asset paths in each function's Metadata, which is how
		// `sam local invoke -t cdk.out/<Stack>.template.json` finds the code.
		"aws:cdk:enable-asset-metadata": true,
	}
	for k, v := range context {
		ctx[k] = v
	}
	app := awscdk.NewApp(&awscdk.AppProps{Outdir: jsii.String(outdir), Context: &ctx})
	all, _ := app.Node().GetAllContext(nil).(map[string]any)
	if err := checkContextKeys(all); err != nil {
		return err
	}
	props, name, err := propsFromContext(app.Node().TryGetContext)
	if err != nil {
		return err
	}
	if _, err := stack.New(app, name, props); err != nil {
		return err
	}
	app.Synth(nil)
	return nil
}
