// Command partitions is the Lambda function that keeps archive partitions
// created ahead of time and retires expired ones, triggered daily.
package main

import (
	"github.com/aws/aws-lambda-go/lambda"

	"github.com/idemarchive/idemarchive/shared/fnenv"
)

func main() {
	env := fnenv.MustLoad()
	lambda.StartWithOptions(newHandler(env), lambda.WithEnableSIGTERM(env.Close))
}
