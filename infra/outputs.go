package main

import (
	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/jsii-runtime-go"
)

// outputs are what an operator (and scripts/deploy.sh) needs after a
// deploy; `cdk deploy` prints them and the README's deploy guide uses them.
func (s *belayStack) outputs() {
	out := func(id, what string, v *string) {
		awscdk.NewCfnOutput(s.stack, jsii.String(id), &awscdk.CfnOutputProps{Description: jsii.String(what), Value: v})
	}
	out("ApiUrl", "BELAY_ENDPOINT for the CLI: the public API's base URL", awscdk.Fn_Sub(jsii.String("https://${Api}.execute-api.${AWS::Region}.${AWS::URLSuffix}/"+publicStage), &map[string]*string{"Api": s.publicAPI.RestApiId()}))
	out("Auth", "who may call the public API: token (BELAY_TOKEN, from ControlTokenSecretArn) or sigv4 (BELAY_AUTH=sigv4, with CallerPolicyArn)", jsii.String(s.cfg.Auth))
	if s.cfg.Auth == authToken {
		out("ControlTokenSecretArn", "the control-plane token: aws secretsmanager get-secret-value --secret-id <this>", s.controlToken.SecretArn())
	} else {
		out("CallerPolicyArn", "attach to the IAM identities allowed to call the public API", s.callerPolicy.ManagedPolicyArn())
	}
	out("ProviderKeySecretArn", "put the model provider's key here: aws secretsmanager put-secret-value --secret-id <this> --secret-string ...", s.providerKey.SecretArn())
	out("PrivateApiUrl", "the internal routes' base URL (reachable only from the sandbox subnets)", s.privateAPIBaseURL())
	out("SandboxRepositoryUri", "the sandbox image's ECR repository (scripts/deploy.sh pushes to it)", s.repo.RepositoryUri())
	out("SandboxTaskDefinitionArn", "the sandbox task definition (pinned to the image digest)", s.taskDef.TaskDefinitionArn())
	out("SandboxLogGroup", "the sandbox tasks' logs", s.sandboxLogs.LogGroupName())
	out("ClusterName", "the ECS cluster the sandbox tasks run in", s.cluster.ClusterName())
	out("StateMachineArn", "the run state machine; executions are named by run id", s.stateMachine.StateMachineArn())
	out("SessionsWebSocketUrl", "the sessions' WebSocket API: wss://.../v1?sessionId=ses_... (belay session chat)", s.wsStage.Url())
	out("TableName", "the DynamoDB table (retained when the stack is deleted)", s.table.TableName())
	out("ArtifactBucketName", "the artifact bucket (retained when the stack is deleted)", s.bucket.BucketName())
	out("AlarmTopicArn", "subscribe to the alarms here (or deploy with -c alarmEmail=ADDRESS)", s.alarmTopic.TopicArn())
	out("CleanupDeadLetterQueueUrl", "cleanup events that could not be processed", s.cleanupDLQ.QueueUrl())
}
