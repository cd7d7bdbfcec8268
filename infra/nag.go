package main

import (
	"github.com/aws/aws-cdk-go/awscdk/v2/awsapigateway"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssecretsmanager"
	"github.com/aws/jsii-runtime-go"
	"github.com/cdklabs/cdk-nag-go/cdknag/v2"
)

// suppressions lists every cdk-nag AWS Solutions finding belay accepts, on
// the resource it concerns (never stack-wide), each with the reason it is
// right for belay. Wildcard (IAM5) suppressions name the exact resource
// pattern they accept, so a new wildcard elsewhere still fails synthesis.
func (s *belayStack) suppressions() {
	suppress := func(construct any, id, reason string, appliesTo ...string) {
		sup := &cdknag.NagPackSuppression{Id: jsii.String(id), Reason: jsii.String(reason)}
		if len(appliesTo) > 0 {
			var at []any
			for _, a := range appliesTo {
				at = append(at, &cdknag.RegexAppliesTo{Regex: jsii.String("/" + a + "/")})
			}
			sup.AppliesTo = &at
		}
		cdknag.NagSuppressions_AddResourceSuppressions(construct, &[]*cdknag.NagPackSuppression{sup}, jsii.Bool(true))
	}

	// Secrets.
	suppress(s.providerKey, "AwsSolutions-SMG4",
		"The provider key is issued and rotated by the model provider, not by AWS: the operator puts each new key with put-secret-value (README, Deploy), and modelproxy reads it again every 10 minutes and whenever the provider refuses it.")
	suppress(s.controlToken, "AwsSolutions-SMG4",
		"The control-plane token is held by every CLI and script that calls belay; a rotation Lambda would change it under them. The operator rotates it by hand (README, Deploy), and the api and stream functions read it again within minutes.")
	suppress(s.signingKey, "AwsSolutions-SMG4",
		"The run tokens are HMACs under this key and live at most one run's wall time; rotating it on a schedule would invalidate the tokens of sandboxes running at that moment. The operator rotates it between runs (README, Deploy).")

	// The sandbox task.
	suppress(s.taskDef, "AwsSolutions-ECS2",
		"The task's one environment variable is BELAY_API_URL, the private API's base URL, which is not a secret. The only per-run secret, the single-use claim code, arrives as a RunTask override and is exchanged once for tokens that never enter the environment.")
	suppress(s.taskDef, "AwsSolutions-IAM5",
		"ecr:GetAuthorizationToken has no resource-level permission; the pull itself (BatchGetImage, GetDownloadUrlForLayer) is limited to belay's sandbox repository.",
		`^Resource::\*$`)
	suppress(s.taskDef.TaskRole(), "AwsSolutions-IAM5",
		"The internal routes carry the run id in their path (/internal/v1/runs/{id}/...), known only at run time: the narrowest resource is the methods under /internal/ of the private API's one stage.",
		`^Resource::arn:<AWS::Partition>:execute-api:<AWS::Region>:<AWS::AccountId>:<PrivateApi[0-9A-F]+>/<PrivateApiDeploymentStage[A-Za-z0-9]+>/\*/internal/\*$`)

	// The functions' and the state machine's roles.
	artifacts := `^Resource::<ArtifactBucket[0-9A-F]+\.Arn>/runs/\*$`
	for _, name := range []string{fnAPI, fnSandboxAPI, fnSteps} {
		suppress(s.fns[name].Role(), "AwsSolutions-IAM5",
			"Artifacts are objects runs/<runId>/<name> and run ids are known only at run time: the runs/ prefix of belay's artifact bucket is the narrowest resource.",
			artifacts)
	}
	suppress(s.fns[fnAPI].Role(), "AwsSolutions-IAM5",
		"Executions are named by run id, known only when a run is created: the resource is this state machine's executions and no other's.",
		`^Resource::\["arn:\$\{AWS::Partition\}:states:\$\{AWS::Region\}:\$\{AWS::AccountId\}:execution:\$\{Name\}:\*",.*"Runs[0-9A-F]+","Name".*\]$`)
	clusterTasks := `^Resource::\["arn:\$\{AWS::Partition\}:ecs:\$\{AWS::Region\}:\$\{AWS::AccountId\}:task/\$\{Cluster\}/\*",.*"Cluster[0-9A-F]+".*\]$`
	for _, name := range []string{fnAPI, fnSteps, fnCleanup} {
		suppress(s.fns[name].Role(), "AwsSolutions-IAM5",
			"A sandbox task's id is known only once it runs (the run records it at claim): the resource is the tasks of belay's cluster and no other.",
			clusterTasks)
	}
	suppress(s.stateMachine.Role(), "AwsSolutions-IAM5",
		"A sandbox task's id is known only once it runs: RunTask .sync describes and, on timeout or abort, stops it; the resource is the tasks of belay's cluster and no other.",
		clusterTasks)
	suppress(s.stateMachine.Role(), "AwsSolutions-IAM5",
		"CloudWatch Logs log delivery (logs:CreateLogDelivery and related) and X-Ray (xray:PutTraceSegments and related) have no resource-level permissions; CDK adds them for the state machine's logging and tracing.",
		`^Resource::\*$`)

	// The two APIs.
	for _, api := range []awsapigateway.RestApi{s.publicAPI, s.privateAPI} {
		suppress(api.DeploymentStage(), "AwsSolutions-APIG6",
			"Every request is in the stage's JSON access log (status, latency, caller, integration error). Execution logging needs the region-wide AWS::ApiGateway::Account CloudWatch role, which this stack would take over from whatever else in the account sets it.")
		suppress(api.DeploymentStage(), "AwsSolutions-APIG3",
			"A WAF web ACL costs a monthly fee per ACL and per request; the stage throttles every method, and every route requires the control-plane token (or an AWS signature), or, on the private API, a VPC endpoint and a run's tokens.")
		suppress(api, "AwsSolutions-COG4",
			"belay has no user directory: callers hold the control-plane token or, with -c auth=sigv4, an AWS IAM identity, and a sandbox holds its run tokens. A Cognito user pool would be a second identity system with no users in it.")
	}
	if s.callerPolicy != nil {
		suppress(s.callerPolicy, "AwsSolutions-IAM5",
			"Callers of belay's public API may use every method of every /v1 route (run ids are in the paths); the resource is the public API's one stage and no other API.",
			`^Resource::arn:<AWS::Partition>:execute-api:<AWS::Region>:<AWS::AccountId>:<PublicApi[0-9A-F]+>/`+publicStage+`/\*/v1/\*$`)
	}
	if s.cfg.Auth == authToken {
		suppress(s.publicAPI, "AwsSolutions-APIG4",
			"Every public route requires the control-plane token, compared in constant time by the api and stream functions, the same check as belay serve. Deploy with -c auth=sigv4 to have API Gateway check AWS signatures (IAM) instead.")
	}
	suppress(s.privateAPI, "AwsSolutions-APIG4",
		"The internal routes are reachable only through the VPC's execute-api endpoint (resource policy on aws:SourceVpce) and authenticate each sandbox by its single-use claim code, then by its run tokens (HMAC-SHA256, one audience each), checked by sandboxapi and modelproxy.")

	// Repository events (triggers.go).
	for _, sec := range []awssecretsmanager.Secret{s.webhookSecret, s.gitCredentials, s.githubToken} {
		suppress(sec, "AwsSolutions-SMG4",
			"The webhook secret, the git credentials and the GitHub token are issued by GitHub (or the git host), not by AWS: the operator rotates them there and puts the new value with put-secret-value (README, Deploy); the functions read them again within minutes.")
	}
	for _, name := range []string{fnDispatcher, fnPublisher} {
		suppress(s.fns[name].Role(), "AwsSolutions-IAM5",
			"Source bundles and artifacts are objects runs/<runId>/<name> and run ids are known only at run time: the runs/ prefix of belay's artifact bucket is the narrowest resource.",
			artifacts)
	}
	suppress(s.webhookMethod, "AwsSolutions-APIG4",
		"GitHub sends no bearer token or AWS signature: the webhook function checks each delivery's X-Hub-Signature-256 (HMAC-SHA256 of the body with the webhook secret, constant time) and stores nothing for a bad one.")
	suppress(s.webhookMethod, "AwsSolutions-COG4",
		"GitHub sends no bearer token or AWS signature: the webhook function checks each delivery's X-Hub-Signature-256 (HMAC-SHA256 of the body with the webhook secret, constant time) and stores nothing for a bad one.")
	suppress(s.dispatcherDLQ, "AwsSolutions-SQS3",
		"This queue is itself the dead-letter queue of the repository-event rules' Lambda targets.")
	// The sessions' WebSocket API (websocket.go).
	suppress(s.wsAPI, "AwsSolutions-APIG4",
		"A WebSocket API authorizes only $connect: under auth=token the ws function checks the control-plane token there (constant time, as on every public route) and refuses the connection; under auth=sigv4 API Gateway checks the caller's AWS signature (IAM). $default and $disconnect reach the function only on a connection $connect accepted.")
	suppress(s.wsAPI, "AwsSolutions-COG4",
		"belay has no user directory: callers hold the control-plane token or, with -c auth=sigv4, an AWS IAM identity.")
	suppress(s.fns[fnWS].Role(), "AwsSolutions-IAM5",
		"Artifacts are objects runs/<runId>/<name> and run ids are known only at run time: the runs/ prefix of belay's artifact bucket is the narrowest resource.",
		artifacts)
	suppress(s.fns[fnWS].Role(), "AwsSolutions-IAM5",
		"Executions are named by run id, known only when a turn starts: the resource is this state machine's executions and no other's.",
		`^Resource::\["arn:\$\{AWS::Partition\}:states:\$\{AWS::Region\}:\$\{AWS::AccountId\}:execution:\$\{Name\}:\*",.*"Runs[0-9A-F]+","Name".*\]$`)
	suppress(s.fns[fnWS].Role(), "AwsSolutions-IAM5",
		"A sandbox task's id is known only once it runs: stopping a turn stops the tasks of belay's cluster and no other.",
		clusterTasks)
	suppress(s.fns[fnWS].Role(), "AwsSolutions-IAM5",
		"Connection ids are API Gateway's, known only when a client connects: the resource is the connections of the sessions' WebSocket API's one stage and no other API.",
		`^Resource::arn:<AWS::Partition>:execute-api:<AWS::Region>:<AWS::AccountId>:<SessionsWebSocket[0-9A-F]+>/`+wsStage+`/\*/@connections/\*$`)
	suppress(s.fns[fnWS].Role(), "AwsSolutions-IAM5",
		"dynamodb:ListStreams has no resource-level permission; CDK grants it for the table stream's event source mapping (the stream's reads are on the table's stream ARN).",
		`^Resource::\*$`)
	suppress(s.cleanupDLQ, "AwsSolutions-SQS3",
		"This queue is itself the dead-letter queue of the ExecutionEnded rule's Lambda target and of cleanup's asynchronous invocations, uses cdk-nag does not see; its depth raises the CleanupDeadLettersAlarm.")
}
