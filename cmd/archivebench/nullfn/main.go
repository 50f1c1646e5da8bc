// Command nullfn is the cold-start baseline of archivebench: a Go Lambda
// function that answers every event with {} and imports nothing but
// aws-lambda-go. What a project function costs beyond it is the project's.
package main

import (
	"context"
	"encoding/json"

	"github.com/aws/aws-lambda-go/lambda"
)

func main() {
	lambda.Start(func(context.Context, json.RawMessage) (json.RawMessage, error) {
		return json.RawMessage(`{}`), nil
	})
}
