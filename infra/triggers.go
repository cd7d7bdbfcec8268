package main

import (
	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsapigateway"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsevents"
	"github.com/aws/aws-cdk-go/awscdk/v2/awseventstargets"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssecretsmanager"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssqs"
	"github.com/aws/jsii-runtime-go"

	"github.com/belay-dev/belay/internal/belay"
)

// The environment of the repository-event functions (lambdaenv).
const (
	envEventBus          = "BELAY_EVENT_BUS"
	envTriggers          = "BELAY_TRIGGERS"
	envWebhookSecretARN  = "BELAY_GITHUB_WEBHOOK_SECRET_ARN"
	envGitCredentialsARN = "BELAY_GIT_CREDENTIALS_SECRET_ARN"
	envGitHubTokenARN    = "BELAY_GITHUB_TOKEN_SECRET_ARN"
)

// The rules' event patterns, also read by the tests that match the
// sample events against the synthesized template.
var (
	// repoEventPattern: belay's own normalized repository events, put on
	// belay's bus by the webhook.
	repoEventPattern = &awsevents.EventPattern{
		Source:     jsii.Strings(belay.RepoEventSource),
		DetailType: jsii.Strings(belay.RepoEventDetailType),
	}
	// codeCommitPattern: CodeCommit's pushes to a branch, on the default
	// bus (deletions and tags start nothing).
	codeCommitPattern = &awsevents.EventPattern{
		Source:     jsii.Strings(belay.CodeCommitSource),
		DetailType: jsii.Strings(belay.CodeCommitDetailType),
		Detail: &map[string]any{
			"event":         []string{"referenceCreated", "referenceUpdated"},
			"referenceType": []string{"branch"},
		},
	}
	// runEndedPattern: a run a repository event started has ended; the
	// publisher writes its safe outputs.
	runEndedPattern = &awsevents.EventPattern{
		Source:     jsii.Strings(belay.RunStatusSource),
		DetailType: jsii.Strings(belay.RunStatusDetailType),
		Detail: &map[string]any{
			"status":  []string{"completed", "failed", "cancelled"},
			"trigger": map[string]any{"provider": []any{map[string]any{"exists": true}}},
		},
	}
)

// triggers adds repository events (DESIGN.md "Repository events"): belay's
// event bus; the webhook function behind POST /v1/webhooks/github (no
// bearer: its signature is its credential), which puts normalized events on
// the bus; the dispatcher on two rules (belay's repository events, and
// CodeCommit's from the default bus), which fetches sources and starts
// runs; the publisher on the rule of ended runs; the secrets they read; and
// BELAY_EVENT_BUS on every function that moves a run, so each run state is
// a "Run Status Change" on the bus users can hook into.
func (s *belayStack) triggers() {
	s.bus = awsevents.NewEventBus(s.stack, jsii.String("Bus"), &awsevents.EventBusProps{
		Description: jsii.String("belay: repository events and run status changes"),
	})
	secret := func(id, description string) awssecretsmanager.Secret {
		return awssecretsmanager.NewSecret(s.stack, jsii.String(id), &awssecretsmanager.SecretProps{
			Description:   jsii.String(description),
			RemovalPolicy: awscdk.RemovalPolicy_DESTROY,
		})
	}
	s.webhookSecret = secret("GitHubWebhookSecret", "belay: the secret GitHub signs webhook deliveries with; copy it into the webhook's settings")
	s.gitCredentials = secret("GitCredentials", "belay: git credentials, one https://USER:TOKEN@HOST[/PATH] a line; put-secret-value after deploy")
	s.githubToken = secret("GitHubToken", "belay: the token of the pull request and comment calls; put-secret-value after deploy")

	webhook, dispatcher, publisher := s.fns[fnWebhook], s.fns[fnDispatcher], s.fns[fnPublisher]
	busName := s.bus.EventBusName()

	// Every function that writes run states puts them on the bus.
	for _, name := range []string{fnAPI, fnSteps, fnCleanup, fnDispatcher, fnWebhook} {
		fn := s.fns[name]
		fn.AddEnvironment(jsii.String(envEventBus), busName, nil)
		s.bus.GrantPutEventsTo(fn, nil)
	}
	for _, fn := range []awslambda.Function{webhook, dispatcher} {
		fn.AddEnvironment(jsii.String(envTriggers), jsii.String(s.cfg.Triggers), nil)
	}

	webhook.AddEnvironment(jsii.String(envWebhookSecretARN), s.webhookSecret.SecretArn(), nil)
	s.grantSecret(webhook, s.webhookSecret)
	s.grantTable(webhook, true) // deliveries

	dispatcher.AddEnvironment(jsii.String(envBucket), s.bucket.BucketName(), nil)
	dispatcher.AddEnvironment(jsii.String(envGitCredentialsARN), s.gitCredentials.SecretArn(), nil)
	dispatcher.AddEnvironment(jsii.String(envStateMachineARN), s.stateMachine.StateMachineArn(), nil)
	dispatcher.AddEnvironment(jsii.String(envClusterARN), s.cluster.ClusterArn(), nil)
	s.grantSecret(dispatcher, s.gitCredentials)
	s.grantTable(dispatcher, true)
	s.grantArtifacts(dispatcher, true) // the source bundle
	dispatcher.AddToRolePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid: jsii.String("StartRuns"), Actions: jsii.Strings("states:StartExecution"),
		Resources: &[]*string{s.stateMachine.StateMachineArn()},
	}))

	// The api function fetches the git sources of runs and sessions
	// created over the API (source.git), with the same credentials.
	api := s.fns[fnAPI]
	api.AddEnvironment(jsii.String(envGitCredentialsARN), s.gitCredentials.SecretArn(), nil)
	s.grantSecret(api, s.gitCredentials)

	publisher.AddEnvironment(jsii.String(envBucket), s.bucket.BucketName(), nil)
	publisher.AddEnvironment(jsii.String(envGitCredentialsARN), s.gitCredentials.SecretArn(), nil)
	publisher.AddEnvironment(jsii.String(envGitHubTokenARN), s.githubToken.SecretArn(), nil)
	s.grantSecret(publisher, s.gitCredentials)
	s.grantSecret(publisher, s.githubToken)
	s.grantTable(publisher, true) // the once-per-run record
	s.grantArtifacts(publisher, false)

	// POST /v1/webhooks/github: GitHub signs the body; it sends no
	// bearer token or AWS signature.
	s.webhookMethod = s.publicAPI.Root().GetResource(jsii.String("v1")).
		AddResource(jsii.String("webhooks"), nil).AddResource(jsii.String("github"), nil).
		AddMethod(jsii.String("POST"), awsapigateway.NewLambdaIntegration(webhook, nil),
			&awsapigateway.MethodOptions{AuthorizationType: awsapigateway.AuthorizationType_NONE})

	// Both rule targets retry, then leave what still fails in a queue.
	s.dispatcherDLQ = awssqs.NewQueue(s.stack, jsii.String("RepoEventDeadLetters"), &awssqs.QueueProps{
		Encryption:      awssqs.QueueEncryption_SQS_MANAGED,
		EnforceSSL:      jsii.Bool(true),
		RetentionPeriod: awscdk.Duration_Days(jsii.Number(14)),
	})
	target := func(fn awslambda.Function) awsevents.IRuleTarget {
		return awseventstargets.NewLambdaFunction(fn, &awseventstargets.LambdaFunctionProps{
			DeadLetterQueue: s.dispatcherDLQ,
			RetryAttempts:   jsii.Number(4),
			MaxEventAge:     awscdk.Duration_Hours(jsii.Number(2)),
		})
	}
	awsevents.NewRule(s.stack, jsii.String("RepoEvents"), &awsevents.RuleProps{
		Description:  jsii.String("belay: a repository event from the webhook; the dispatcher starts its run"),
		EventBus:     s.bus,
		EventPattern: repoEventPattern,
		Targets:      &[]awsevents.IRuleTarget{target(dispatcher)},
	})
	awsevents.NewRule(s.stack, jsii.String("CodeCommitPushes"), &awsevents.RuleProps{
		Description:  jsii.String("belay: a push to a CodeCommit branch; the dispatcher starts a run if the triggers name it"),
		EventPattern: codeCommitPattern,
		Targets:      &[]awsevents.IRuleTarget{target(dispatcher)},
	})
	awsevents.NewRule(s.stack, jsii.String("RunsEnded"), &awsevents.RuleProps{
		Description:  jsii.String("belay: a run a repository event started has ended; the publisher writes its safe outputs"),
		EventBus:     s.bus,
		EventPattern: runEndedPattern,
		Targets:      &[]awsevents.IRuleTarget{target(publisher)},
	})
}
