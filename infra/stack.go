package main

import (
	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsapigateway"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsapigatewayv2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsdynamodb"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsec2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsecr"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsecs"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsevents"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslogs"
	"github.com/aws/aws-cdk-go/awscdk/v2/awss3"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssecretsmanager"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssns"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssqs"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsstepfunctions"
	"github.com/aws/jsii-runtime-go"
	"github.com/cdklabs/cdk-nag-go/cdknag/v2"
)

// stackName is the CloudFormation stack's name (and the CDK id).
const stackName = "Belay"

// belayStack is the one stack, with the resources one concern hands to
// another. Each concern's file fills its part, in the order newStack calls
// them.
type belayStack struct {
	// stack is the CDK stack; jsii cannot take a Go struct that embeds it
	// as a construct scope, so it is a field.
	stack awscdk.Stack
	cfg   config

	// network.go
	vpc            awsec2.Vpc
	sandboxSubnets *awsec2.SubnetSelection
	sandboxSG      awsec2.SecurityGroup
	executeAPIVpce awsec2.InterfaceVpcEndpoint
	ecrAPIVpce     awsec2.InterfaceVpcEndpoint
	ecrDkrVpce     awsec2.InterfaceVpcEndpoint
	logsVpce       awsec2.InterfaceVpcEndpoint
	s3Vpce         awsec2.GatewayVpcEndpoint

	// data.go
	table        awsdynamodb.Table
	bucket       awss3.Bucket
	providerKey  awssecretsmanager.Secret
	controlToken awssecretsmanager.Secret
	signingKey   awssecretsmanager.Secret

	// functions.go
	fns map[string]awslambda.Function

	// api.go
	publicAPI    awsapigateway.RestApi
	privateAPI   awsapigateway.RestApi
	callerPolicy awsiam.ManagedPolicy

	// sandbox.go
	repo        awsecr.Repository
	cluster     awsecs.Cluster
	taskDef     awsecs.FargateTaskDefinition
	sandboxLogs awslogs.LogGroup
	imageDigest *string

	// orchestration.go
	stateMachine awsstepfunctions.StateMachine
	cleanupDLQ   awssqs.Queue

	// alarms.go
	alarmTopic awssns.Topic

	// triggers.go
	bus            awsevents.EventBus
	webhookSecret  awssecretsmanager.Secret
	gitCredentials awssecretsmanager.Secret
	githubToken    awssecretsmanager.Secret
	dispatcherDLQ  awssqs.Queue
	webhookMethod  awsapigateway.Method

	// websocket.go
	wsAPI   awsapigatewayv2.WebSocketApi
	wsStage awsapigatewayv2.WebSocketStage
}

// newApp adds belay's stack to app with cdk-nag's AWS Solutions checks, so
// every synthesis (make synth, make deploy, the tests) runs them: an
// unsuppressed finding is an error annotation, and the CDK CLI refuses to
// deploy a stack that has one.
func newApp(app awscdk.App) (*belayStack, error) {
	cfg, err := readConfig(app)
	if err != nil {
		return nil, err
	}
	s, err := newStack(app, stackName, cfg)
	if err != nil {
		return nil, err
	}
	awscdk.Aspects_Of(app).Add(cdknag.NewAwsSolutionsChecks(&cdknag.NagPackProps{Verbose: jsii.Bool(true)}), nil)
	return s, nil
}

// newStack builds every concern, in dependency order.
func newStack(scope awscdk.App, id string, cfg config) (*belayStack, error) {
	s := &belayStack{
		stack: awscdk.NewStack(scope, jsii.String(id), &awscdk.StackProps{
			Description: jsii.String("belay: a control plane that runs an AI coding agent in a hardened sandbox"),
		}),
		cfg: cfg,
		fns: map[string]awslambda.Function{},
	}
	s.network()
	s.data()
	s.cluster = newCluster(s)
	if err := s.functions(); err != nil {
		return nil, err
	}
	s.api()
	s.sandbox()
	s.endpointPolicies()
	if err := s.orchestration(); err != nil {
		return nil, err
	}
	s.triggers()
	s.websocket()
	s.alarms()
	s.outputs()
	s.suppressions()
	return s, nil
}
