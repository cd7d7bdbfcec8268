// Command infra is belay's AWS deployment as a CDK app (`cdk synth`,
// `cdk deploy`; cdk.json runs it as `go run ./infra`). One file per
// concern: network, data, functions, api, sandbox, orchestration, alarms,
// outputs, and nag (cdk-nag's AWS Solutions checks and the reasons for
// each suppression). config.go lists the context values it reads.
package main

import (
	"fmt"
	"os"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/jsii-runtime-go"
)

func main() {
	defer jsii.Close()
	app := awscdk.NewApp(nil)
	if _, err := newApp(app); err != nil {
		fmt.Fprintln(os.Stderr, err)
		jsii.Close()
		os.Exit(1)
	}
	app.Synth(nil)
}
