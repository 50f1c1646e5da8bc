// Command lookup is the Lambda function that answers archive queries: behind
// API Gateway (HTTP API payload 2.0 or REST proxy 1.0) and for services that
// call lambda:Invoke synchronously.
package main

import (
	"github.com/aws/aws-lambda-go/lambda"

	"github.com/idemarchive/idemarchive/shared/fnenv"
)

func main() {
	env := fnenv.MustLoad()
	lambda.StartWithOptions(newHandler(env), lambda.WithEnableSIGTERM(env.Close))
}
