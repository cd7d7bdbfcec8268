package main

import (
	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsapigatewayv2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsapigatewayv2authorizers"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsapigatewayv2integrations"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambdaeventsources"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslogs"
	"github.com/aws/jsii-runtime-go"
)

// The sessions' WebSocket API (DESIGN.md "Sessions (multi-turn)").
const (
	wsStage = "v1"
	// envWSEndpoint is the ws function's management API endpoint, the
	// stage's callback URL (lambdaenv.EnvWebSocketEndpoint).
	envWSEndpoint = "BELAY_WS_ENDPOINT"
)

// websocket adds the API Gateway WebSocket API of sessions: routes
// $connect, $default and $disconnect on the one ws function (it switches
// on the route key), a stage with access logs, and the table's stream
// (keys only) feeding the same function the inserted events of runs, which
// it pushes to the sessions' connections with PostToConnection. The ws
// function runs the same handler as api for a message (a chat starts a
// turn: a run, so it may start and stop executions and stop tasks).
func (s *belayStack) websocket() {
	fn := s.fns[fnWS]
	integration := func(id string) awsapigatewayv2integrations.WebSocketLambdaIntegration {
		return awsapigatewayv2integrations.NewWebSocketLambdaIntegration(jsii.String(id), fn, nil)
	}
	connect := &awsapigatewayv2.WebSocketRouteOptions{Integration: integration("WsConnectIntegration")}
	if s.cfg.Auth == authSigV4 {
		// API Gateway checks the caller's SigV4 signature on $connect
		// (the only route a WebSocket API authorizes); with a token the
		// function checks it.
		connect.Authorizer = awsapigatewayv2authorizers.NewWebSocketIamAuthorizer()
	}
	s.wsAPI = awsapigatewayv2.NewWebSocketApi(s.stack, jsii.String("SessionsWebSocket"), &awsapigatewayv2.WebSocketApiProps{
		ApiName:                  jsii.String("belay-sessions"),
		Description:              jsii.String("belay: sessions over WebSocket (?sessionId=ses_...): chat, approve, stop; the session's events pushed"),
		ConnectRouteOptions:      connect,
		DisconnectRouteOptions:   &awsapigatewayv2.WebSocketRouteOptions{Integration: integration("WsDisconnectIntegration")},
		DefaultRouteOptions:      &awsapigatewayv2.WebSocketRouteOptions{Integration: integration("WsDefaultIntegration")},
		RouteSelectionExpression: jsii.String("$request.body.type"),
	})
	logs := awslogs.NewLogGroup(s.stack, jsii.String("SessionsWebSocketAccessLogs"), &awslogs.LogGroupProps{
		Retention:     retention(s.cfg.LogRetentionDays),
		RemovalPolicy: awscdk.RemovalPolicy_DESTROY,
	})
	s.wsStage = awsapigatewayv2.NewWebSocketStage(s.stack, jsii.String("SessionsWebSocketStage"), &awsapigatewayv2.WebSocketStageProps{
		WebSocketApi: s.wsAPI,
		StageName:    jsii.String(wsStage),
		AutoDeploy:   jsii.Bool(true),
		Throttle:     &awsapigatewayv2.ThrottleSettings{RateLimit: jsii.Number(50), BurstLimit: jsii.Number(100)},
	})
	// The L2 stage has no access-log option yet: set it on the L1.
	cfn := s.wsStage.Node().DefaultChild().(awsapigatewayv2.CfnStage)
	cfn.SetAccessLogSettings(&awsapigatewayv2.CfnStage_AccessLogSettingsProperty{
		DestinationArn: logs.LogGroupArn(),
		Format: jsii.String(`{"requestId":"$context.requestId","connectionId":"$context.connectionId","routeKey":"$context.routeKey",` +
			`"eventType":"$context.eventType","status":"$context.status","ip":"$context.identity.sourceIp","time":"$context.requestTime"}`),
	})

	if s.cfg.Auth == authSigV4 {
		s.callerPolicy.AddStatements(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
			Sid:     jsii.String("ConnectSessions"),
			Actions: jsii.Strings("execute-api:Invoke"),
			Resources: &[]*string{awscdk.Fn_Sub(jsii.String("arn:${AWS::Partition}:execute-api:${AWS::Region}:${AWS::AccountId}:${Api}/"+wsStage+"/$connect"),
				&map[string]*string{"Api": s.wsAPI.ApiId()})},
		}))
	}
	fn.AddEnvironment(jsii.String(envWSEndpoint), s.wsStage.CallbackUrl(), nil)
	fn.AddEnvironment(jsii.String(envBucket), s.bucket.BucketName(), nil)
	fn.AddEnvironment(jsii.String(envStateMachineARN), s.stateMachine.StateMachineArn(), nil)
	fn.AddEnvironment(jsii.String(envClusterARN), s.cluster.ClusterArn(), nil)
	fn.AddEnvironment(jsii.String(envEventBus), s.bus.EventBusName(), nil)
	fn.AddEnvironment(jsii.String(envAuth), jsii.String(s.cfg.Auth), nil)
	if s.cfg.Auth == authToken {
		fn.AddEnvironment(jsii.String(envControlTokenARN), s.controlToken.SecretArn(), nil)
		s.grantSecret(fn, s.controlToken)
	}
	s.bus.GrantPutEventsTo(fn, nil)
	s.grantTable(fn, true)
	s.grantArtifacts(fn, false)
	s.wsStage.GrantManagementApiAccess(fn)
	fn.AddToRolePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid: jsii.String("RunTurns"), Actions: jsii.Strings("states:StartExecution"),
		Resources: &[]*string{s.stateMachine.StateMachineArn()},
	}))
	fn.AddToRolePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid: jsii.String("StopTurns"), Actions: jsii.Strings("states:StopExecution"),
		Resources: &[]*string{s.executionsArn()},
	}))
	fn.AddToRolePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid: jsii.String("StopSandboxTasks"), Actions: jsii.Strings("ecs:StopTask"),
		Resources: &[]*string{s.clusterTasksArn()},
	}))

	// The events of runs, as they are inserted: the function pushes those
	// of session turns. Failed records are retried alone, then dropped to
	// a queue after the retries.
	fn.AddEventSource(awslambdaeventsources.NewDynamoEventSource(s.table, &awslambdaeventsources.DynamoEventSourceProps{
		StartingPosition:        awslambda.StartingPosition_LATEST,
		BatchSize:               jsii.Number(100),
		RetryAttempts:           jsii.Number(2),
		BisectBatchOnError:      jsii.Bool(true),
		ReportBatchItemFailures: jsii.Bool(true),
		Filters: &[]*map[string]any{awslambda.FilterCriteria_Filter(&map[string]any{
			"eventName": awslambda.FilterRule_IsEqual(jsii.String("INSERT")),
			"dynamodb": map[string]any{"Keys": map[string]any{
				"PK": map[string]any{"S": awslambda.FilterRule_BeginsWith(jsii.String("RUN#"))},
				"SK": map[string]any{"S": awslambda.FilterRule_BeginsWith(jsii.String("EVT#"))},
			}},
		})},
	}))
}
