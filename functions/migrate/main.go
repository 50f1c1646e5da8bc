// Command migrate is the Lambda function behind the stack's schema custom
// resource: on every deploy it migrates the schema, creates the functions'
// database users and the archive partitions (package provision), and answers
// CloudFormation, with the reason when it failed.
package main

import (
	"github.com/aws/aws-lambda-go/lambda"

	"github.com/idemarchive/idemarchive/shared/fnenv"
)

func main() {
	env := fnenv.MustLoad()
	lambda.StartWithOptions(lambdaHandler(env), lambda.WithEnableSIGTERM(env.Close))
}
