// Command sweep is the Lambda function that moves expired idempotency keys into
// the archive, triggered by an EventBridge schedule.
package main

import (
	"github.com/aws/aws-lambda-go/lambda"

	"github.com/idemarchive/idemarchive/shared/fnenv"
)

func main() {
	env := fnenv.MustLoad()
	lambda.StartWithOptions(newHandler(env), lambda.WithEnableSIGTERM(env.Close))
}
