package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslogs"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssecretsmanager"
	"github.com/aws/jsii-runtime-go"
)

// The functions (DESIGN.md "Functions"), each built by `make build` as
// bin/functions/<name>/bootstrap for linux/arm64 on provided.al2023.
const (
	fnAPI        = "api"
	fnStream     = "stream"
	fnModelProxy = "modelproxy"
	fnSandboxAPI = "sandboxapi"
	fnSteps      = "steps"
	fnCleanup    = "cleanup"
	// Repository events (triggers.go).
	fnWebhook    = "webhook"
	fnDispatcher = "dispatcher"
	fnPublisher  = "publisher"
	// Sessions' WebSocket API (websocket.go).
	fnWS = "ws"
)

// functionNames lists them in the order the stack builds them.
var functionNames = []string{fnAPI, fnStream, fnModelProxy, fnSandboxAPI, fnSteps, fnCleanup, fnWebhook, fnDispatcher, fnPublisher, fnWS}

// The environment the functions read (CONTRACTS.md "Function names and
// environment"; the README lists every variable of every function).
const (
	envTable           = "BELAY_TABLE"
	envBucket          = "BELAY_BUCKET"
	envModel           = "BELAY_MODEL"
	envStateMachineARN = "BELAY_STATE_MACHINE_ARN"
	envClusterARN      = "BELAY_CLUSTER_ARN"
	envControlTokenARN = "BELAY_CONTROL_TOKEN_SECRET_ARN"
	envSigningKeyARN   = "BELAY_SIGNING_KEY_SECRET_ARN"
	envModelAPIURL     = "BELAY_MODEL_API_URL"
	envModelAPIKeyARN  = "BELAY_MODEL_API_KEY_SECRET_ARN"
	envModelProvider   = "BELAY_MODEL_PROVIDER"
	envAuth            = "BELAY_AUTH"
	envExtensions      = "BELAY_EXTENSIONS"
	envChecks          = "BELAY_CHECKS"
)

// functionSpec is what differs between the functions.
type functionSpec struct {
	memoryMiB   float64
	timeout     awscdk.Duration
	description string
}

func functionSpecs() map[string]functionSpec {
	return map[string]functionSpec{
		// API Gateway answers a buffered route within 29 s.
		fnAPI: {512, awscdk.Duration_Seconds(jsii.Number(29)), "belay public API (buffered routes)"},
		// A streamed response may last 15 minutes; the stream closes itself
		// before (DESIGN.md "Time limits").
		fnStream: {256, awscdk.Duration_Minutes(jsii.Number(15)), "belay event stream (SSE, response streaming)"},
		// A model call with 4,096 tokens of output can take minutes; the
		// proxy's own upstream timeout stays below this.
		fnModelProxy: {256, awscdk.Duration_Minutes(jsii.Number(15)), "belay model proxy (private API); the only reader of the provider key"},
		fnSandboxAPI: {256, awscdk.Duration_Seconds(jsii.Number(29)), "belay internal routes for the sandbox (private API): claim, events, approvals, outputs"},
		fnSteps:      {512, awscdk.Duration_Seconds(jsii.Number(60)), "belay Step Functions tasks: activate, validate, finalize, fail"},
		fnCleanup:    {256, awscdk.Duration_Seconds(jsii.Number(60)), "belay cleanup after an execution is aborted, timed out or failed"},
		// GitHub waits 10 s for an answer; the webhook only records and
		// publishes.
		fnWebhook: {256, awscdk.Duration_Seconds(jsii.Number(10)), "belay GitHub webhooks: verify, match the triggers, put the repository event on the bus"},
		// A fetch of up to 100 MiB of history, in memory and /tmp.
		fnDispatcher: {1024, awscdk.Duration_Minutes(jsii.Number(5)), "belay dispatcher: a repository event becomes a run (source fetched by the control plane)"},
		fnPublisher:  {1024, awscdk.Duration_Minutes(jsii.Number(5)), "belay publisher: a finished run's safe outputs (branch, pull request, comment)"},
		// A message starts a turn as api starts a run; a stream batch
		// pushes up to 100 events to each connection.
		fnWS: {512, awscdk.Duration_Seconds(jsii.Number(60)), "belay sessions' WebSocket API ($connect, $default, $disconnect) and event push from the table's stream"},
	}
}

// functions builds the Lambda functions, each with a role of its own
// (no AWS managed policy), a log group of its own, and exactly the grants
// DESIGN.md's "may touch" column gives it. What depends on later concerns
// (the state machine's ARN) is added by those concerns.
func (s *belayStack) functions() error {
	specs := functionSpecs()
	for _, name := range functionNames {
		boot := filepath.Join(s.cfg.FunctionsDir, name, "bootstrap")
		if fi, err := os.Stat(boot); err != nil || !fi.Mode().IsRegular() {
			return fmt.Errorf("function %s: %s is missing; run `make build` first (or set -c %s=DIR)", name, boot, ctxFunctionsDir)
		}
		spec := specs[name]
		id := functionID(name)
		logs := awslogs.NewLogGroup(s.stack, jsii.String(id+"Logs"), &awslogs.LogGroupProps{
			Retention:     retention(s.cfg.LogRetentionDays),
			RemovalPolicy: awscdk.RemovalPolicy_DESTROY,
		})
		role := awsiam.NewRole(s.stack, jsii.String(id+"Role"), &awsiam.RoleProps{
			AssumedBy:   awsiam.NewServicePrincipal(jsii.String("lambda.amazonaws.com"), nil),
			Description: jsii.String("belay " + name + " function"),
		})
		logs.GrantWrite(role)
		fn := awslambda.NewFunction(s.stack, jsii.String(id), &awslambda.FunctionProps{
			Description:  jsii.String(spec.description),
			Runtime:      awslambda.Runtime_PROVIDED_AL2023(),
			Architecture: awslambda.Architecture_ARM_64(),
			Handler:      jsii.String("bootstrap"),
			Code:         awslambda.Code_FromAsset(jsii.String(filepath.Dir(boot)), nil),
			MemorySize:   jsii.Number(spec.memoryMiB),
			Timeout:      spec.timeout,
			Role:         role,
			LogGroup:     logs,
			// Every function builds the shared handler's limits from the
			// configured model, so each gets BELAY_MODEL.
			Environment: &map[string]*string{
				envTable: s.table.TableName(),
				envModel: jsii.String(s.cfg.Model),
			},
		})
		// The operator's additions to the run limits, read with them.
		for env, v := range map[string]string{envExtensions: s.cfg.Extensions, envChecks: s.cfg.Checks} {
			if v != "" {
				fn.AddEnvironment(jsii.String(env), jsii.String(v), nil)
			}
		}
		s.fns[name] = fn
	}

	// api starts and stops executions (orchestration.go adds the state
	// machine) and stops a cancelled run's task.
	api := s.fns[fnAPI]
	api.AddEnvironment(jsii.String(envBucket), s.bucket.BucketName(), nil)
	s.grantTable(api, true)
	s.grantArtifacts(api, true) // git sources: their bundles

	s.grantTable(s.fns[fnStream], false)
	for _, name := range []string{fnAPI, fnStream} {
		fn := s.fns[name]
		fn.AddEnvironment(jsii.String(envAuth), jsii.String(s.cfg.Auth), nil)
		if s.cfg.Auth == authToken {
			fn.AddEnvironment(jsii.String(envControlTokenARN), s.controlToken.SecretArn(), nil)
			s.grantSecret(fn, s.controlToken)
		}
	}

	mp := s.fns[fnModelProxy]
	mp.AddEnvironment(jsii.String(envModelAPIURL), jsii.String(s.cfg.ModelAPIURL), nil)
	mp.AddEnvironment(jsii.String(envModelProvider), jsii.String(s.cfg.ModelProvider), nil)
	mp.AddEnvironment(jsii.String(envModelAPIKeyARN), s.providerKey.SecretArn(), nil)
	mp.AddEnvironment(jsii.String(envSigningKeyARN), s.signingKey.SecretArn(), nil)
	s.grantTable(mp, true)
	s.grantSecret(mp, s.providerKey)
	s.grantSecret(mp, s.signingKey)

	sa := s.fns[fnSandboxAPI]
	sa.AddEnvironment(jsii.String(envBucket), s.bucket.BucketName(), nil)
	sa.AddEnvironment(jsii.String(envSigningKeyARN), s.signingKey.SecretArn(), nil)
	s.grantTable(sa, true)
	s.grantArtifacts(sa, true)
	s.grantSecret(sa, s.signingKey)

	steps := s.fns[fnSteps]
	steps.AddEnvironment(jsii.String(envBucket), s.bucket.BucketName(), nil)
	s.grantTable(steps, true)
	s.grantArtifacts(steps, true)

	s.grantTable(s.fns[fnCleanup], true)

	// api (cancel), steps (fail) and cleanup stop a run's sandbox task.
	for _, name := range []string{fnAPI, fnSteps, fnCleanup} {
		fn := s.fns[name]
		fn.AddEnvironment(jsii.String(envClusterARN), s.cluster.ClusterArn(), nil)
		fn.AddToRolePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
			Sid:       jsii.String("StopSandboxTasks"),
			Actions:   jsii.Strings("ecs:StopTask"),
			Resources: &[]*string{s.clusterTasksArn()},
		}))
	}
	return nil
}

// functionID is the construct id of a function: "Api", "ModelProxy", ...
func functionID(name string) string {
	switch name {
	case fnAPI:
		return "Api"
	case fnModelProxy:
		return "ModelProxy"
	case fnSandboxAPI:
		return "SandboxApi"
	case fnWS:
		return "WebSocket"
	}
	return string(name[0]-'a'+'A') + name[1:]
}

// grantTable lets fn read (and write) the table and query its two listing
// indexes by name: no wildcard over index names.
func (s *belayStack) grantTable(fn awslambda.Function, write bool) {
	actions := []string{"dynamodb:GetItem", "dynamodb:BatchGetItem", "dynamodb:Query", "dynamodb:ConditionCheckItem", "dynamodb:DescribeTable"}
	if write {
		actions = append(actions, "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem", "dynamodb:BatchWriteItem")
	}
	arn := s.table.TableArn()
	fn.AddToRolePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:     jsii.String("Table"),
		Actions: jsii.Strings(actions...),
		Resources: &[]*string{
			arn,
			jsii.String(*arn + "/index/" + indexAllRuns),
			jsii.String(*arn + "/index/" + indexByStatus),
		},
	}))
}

// grantArtifacts lets fn read (and write) run artifacts. The objects'
// names hold run ids, so the runs/ prefix is the narrowest resource.
func (s *belayStack) grantArtifacts(fn awslambda.Function, write bool) {
	actions := []string{"s3:GetObject"}
	if write {
		actions = append(actions, "s3:PutObject")
	}
	fn.AddToRolePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:       jsii.String("Artifacts"),
		Actions:   jsii.Strings(actions...),
		Resources: &[]*string{s.bucket.ArnForObjects(jsii.String(artifactPrefix + "*"))},
	}))
	fn.AddToRolePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:        jsii.String("ListArtifacts"),
		Actions:    jsii.Strings("s3:ListBucket"),
		Resources:  &[]*string{s.bucket.BucketArn()},
		Conditions: &map[string]any{"StringLike": map[string]any{"s3:prefix": artifactPrefix + "*"}},
	}))
}

// grantSecret lets fn read one secret's value.
func (s *belayStack) grantSecret(fn awslambda.Function, secret awssecretsmanager.Secret) {
	fn.AddToRolePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Actions:   jsii.Strings("secretsmanager:GetSecretValue"),
		Resources: &[]*string{secret.SecretArn()},
	}))
}
