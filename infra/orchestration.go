package main

import (
	"encoding/json"
	"fmt"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsevents"
	"github.com/aws/aws-cdk-go/awscdk/v2/awseventstargets"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambdadestinations"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslogs"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssqs"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsstepfunctions"
	"github.com/aws/jsii-runtime-go"
)

// The state machine's states (CONTRACTS.md "Step Functions tasks"). The
// local execution test addresses them by these names.
const (
	stateActivate = "Activate"
	statePrepare  = "PrepareSandbox"
	stateRun      = "RunSandbox"
	stateValidate = "Validate"
	stateFinalize = "Finalize"
	stateFail     = "Fail"
	stateFailed   = "RunFailed"
)

// Substitutions in the definition, filled by CloudFormation
// (DefinitionSubstitutions) with the resources' ARNs and ids.
const (
	subSteps          = "StepsFunctionArn"
	subCluster        = "ClusterArn"
	subTaskDefinition = "TaskDefinitionArn"
	subSecurityGroup  = "SandboxSecurityGroupId"
	subSubnet         = "SandboxSubnet" // + index
)

// executionTimeout bounds a whole execution, past any run's wall time (a
// run's own deadline bounds the sandbox); when it fires, the execution
// ends TIMED_OUT and cleanup finalizes the run.
const executionTimeout = 6 * 60 * 60

// lambdaTaskTimeout bounds one steps invocation (its function times out
// at 60 s).
const lambdaTaskTimeout = 70

// stepsDefinition is the state machine, in the Amazon States Language:
//
//	Activate → PrepareSandbox → RunSandbox (ECS RunTask .sync, timeout from
//	activate) → Validate → Finalize
//
// RunSandbox's Catch goes to Validate with the error (a sandbox that exits
// non-zero, times out or cannot start still has its outcome decided and
// recorded there); every other Catch goes to Fail, which finalizes the run
// failed and revokes its capability, then ends the execution failed.
func stepsDefinition(subnets int) (string, error) {
	sub := func(name string) string { return "${" + name + "}" }
	lambdaRetry := []any{map[string]any{
		"ErrorEquals":     []string{"Lambda.ServiceException", "Lambda.AWSLambdaException", "Lambda.SdkClientException", "Lambda.TooManyRequestsException"},
		"IntervalSeconds": 1,
		"MaxAttempts":     3,
		"BackoffRate":     2,
		"JitterStrategy":  "FULL",
	}}
	toFail := []any{map[string]any{"ErrorEquals": []string{"States.ALL"}, "ResultPath": "$.error", "Next": stateFail}}
	step := func(params map[string]any, resultPath, next string) map[string]any {
		st := map[string]any{
			"Type":           "Task",
			"Resource":       sub(subSteps),
			"Parameters":     params,
			"ResultPath":     resultPath,
			"TimeoutSeconds": lambdaTaskTimeout,
			"Retry":          lambdaRetry,
			"Catch":          toFail,
		}
		if next == "" {
			st["End"] = true
		} else {
			st["Next"] = next
		}
		return st
	}
	subnetIDs := make([]string, subnets)
	for i := range subnetIDs {
		subnetIDs[i] = sub(fmt.Sprintf("%s%d", subSubnet, i))
	}

	failStep := step(map[string]any{"step": "fail", "runId.$": "$.runId", "error.$": "$.error"}, "$.fail", stateFailed)
	delete(failStep, "Catch") // the last resort: if it fails, the execution fails and cleanup runs
	failStep["Retry"] = []any{map[string]any{
		"ErrorEquals": []string{"States.ALL"}, "IntervalSeconds": 2, "MaxAttempts": 4, "BackoffRate": 2, "JitterStrategy": "FULL",
	}}

	def := map[string]any{
		"Comment":        "belay run: activate the capability, run the sandbox task, validate its outputs, finalize; every error ends in Fail, which finalizes the run failed and revokes the capability",
		"StartAt":        stateActivate,
		"TimeoutSeconds": executionTimeout,
		"States": map[string]any{
			stateActivate: step(map[string]any{"step": "activate", "runId.$": "$.runId"}, "$.activate", statePrepare),
			statePrepare: map[string]any{
				"Type":       "Pass",
				"Comment":    "Validate reads both the task's output and the error; only one of them is set later",
				"Result":     map[string]any{"task": nil, "error": nil},
				"ResultPath": "$.sandbox",
				"Next":       stateRun,
			},
			stateRun: map[string]any{
				"Type":     "Task",
				"Resource": "arn:aws:states:::ecs:runTask.sync",
				"Parameters": map[string]any{
					"Cluster":              sub(subCluster),
					"TaskDefinition":       sub(subTaskDefinition),
					"LaunchType":           "FARGATE",
					"PlatformVersion":      "LATEST",
					"EnableExecuteCommand": false,
					"StartedBy.$":          "$.runId",
					"NetworkConfiguration": map[string]any{
						"AwsvpcConfiguration": map[string]any{
							"Subnets":        subnetIDs,
							"SecurityGroups": []string{sub(subSecurityGroup)},
							"AssignPublicIp": "DISABLED",
						},
					},
					"Overrides": map[string]any{
						"ContainerOverrides": []any{map[string]any{
							"Name": sandboxContainer,
							"Environment": []any{map[string]any{
								"Name": "BELAY_CLAIM", "Value.$": "$.activate.claim",
							}},
						}},
					},
				},
				"TimeoutSecondsPath": "$.activate.timeoutSeconds",
				"ResultPath":         "$.sandbox.task",
				"Catch":              []any{map[string]any{"ErrorEquals": []string{"States.ALL"}, "ResultPath": "$.sandbox.error", "Next": stateValidate}},
				"Next":               stateValidate,
			},
			stateValidate: step(map[string]any{
				"step": "validate", "runId.$": "$.runId", "attempt.$": "$.activate.attempt",
				"task.$": "$.sandbox.task", "error.$": "$.sandbox.error",
			}, "$.outcome", stateFinalize),
			stateFinalize: step(map[string]any{"step": "finalize", "runId.$": "$.runId", "outcome.$": "$.outcome"}, "$.finalize", ""),
			stateFail:     failStep,
			stateFailed: map[string]any{
				"Type":  "Fail",
				"Error": "belay.RunFailed",
				"Cause": "a step failed; the run was finalized failed and its capability revoked (see the Fail state's input)",
			},
		},
	}
	b, err := json.MarshalIndent(def, "", "  ")
	return string(b), err
}

// orchestration builds the state machine that sequences a run, its role,
// and the EventBridge rule that runs cleanup when an execution ends
// without its own finalize (Step Functions runs no Catch when an execution
// is stopped or times out as a whole).
func (s *belayStack) orchestration() error {
	subnets := s.vpc.SelectSubnets(s.sandboxSubnets).SubnetIds
	def, err := stepsDefinition(len(*subnets))
	if err != nil {
		return fmt.Errorf("state machine definition: %w", err)
	}
	subs := map[string]*string{
		subSteps:          s.fns[fnSteps].FunctionArn(),
		subCluster:        s.cluster.ClusterArn(),
		subTaskDefinition: s.taskDef.TaskDefinitionArn(),
		subSecurityGroup:  s.sandboxSG.SecurityGroupId(),
	}
	for i, id := range *subnets {
		subs[fmt.Sprintf("%s%d", subSubnet, i)] = id
	}

	role := awsiam.NewRole(s.stack, jsii.String("StateMachineRole"), &awsiam.RoleProps{
		AssumedBy:   awsiam.NewServicePrincipal(jsii.String("states.amazonaws.com"), nil),
		Description: jsii.String("belay state machine: the steps function, the sandbox task, nothing else"),
	})
	statements := []*awsiam.PolicyStatementProps{
		{Sid: jsii.String("Steps"), Actions: jsii.Strings("lambda:InvokeFunction"), Resources: &[]*string{s.fns[fnSteps].FunctionArn()}},
		{
			Sid: jsii.String("RunSandbox"), Actions: jsii.Strings("ecs:RunTask"), Resources: &[]*string{s.taskDef.TaskDefinitionArn()},
			Conditions: &map[string]any{"ArnEquals": map[string]any{"ecs:cluster": s.cluster.ClusterArn()}},
		},
		{Sid: jsii.String("WatchSandbox"), Actions: jsii.Strings("ecs:DescribeTasks", "ecs:StopTask"), Resources: &[]*string{s.clusterTasksArn()}},
		{
			Sid: jsii.String("PassSandboxRoles"), Actions: jsii.Strings("iam:PassRole"),
			Resources:  &[]*string{s.taskDef.TaskRole().RoleArn(), s.taskDef.ObtainExecutionRole().RoleArn()},
			Conditions: &map[string]any{"StringEquals": map[string]any{"iam:PassedToService": "ecs-tasks.amazonaws.com"}},
		},
		{
			// .sync learns that the task stopped from this managed rule.
			Sid: jsii.String("SyncRule"), Actions: jsii.Strings("events:PutTargets", "events:PutRule", "events:DescribeRule"),
			Resources: &[]*string{awscdk.Fn_Sub(jsii.String("arn:${AWS::Partition}:events:${AWS::Region}:${AWS::AccountId}:rule/StepFunctionsGetEventsForECSTaskRule"), nil)},
		},
	}
	for _, st := range statements {
		role.AddToPolicy(awsiam.NewPolicyStatement(st))
	}

	logs := awslogs.NewLogGroup(s.stack, jsii.String("StateMachineLogs"), &awslogs.LogGroupProps{
		Retention:     retention(s.cfg.LogRetentionDays),
		RemovalPolicy: awscdk.RemovalPolicy_DESTROY,
	})
	s.stateMachine = awsstepfunctions.NewStateMachine(s.stack, jsii.String("Runs"), &awsstepfunctions.StateMachineProps{
		Comment:                 jsii.String("belay runs; each execution is named by its run id"),
		StateMachineType:        awsstepfunctions.StateMachineType_STANDARD,
		DefinitionBody:          awsstepfunctions.DefinitionBody_FromString(jsii.String(def)),
		DefinitionSubstitutions: &subs,
		Role:                    role,
		TracingEnabled:          jsii.Bool(true),
		Logs: &awsstepfunctions.LogOptions{
			Destination: logs,
			Level:       awsstepfunctions.LogLevel_ALL,
			// Inputs and outputs hold the claim code: state transitions
			// are logged, their data is not.
			IncludeExecutionData: jsii.Bool(false),
		},
	})

	api := s.fns[fnAPI]
	api.AddEnvironment(jsii.String(envStateMachineARN), s.stateMachine.StateMachineArn(), nil)
	api.AddToRolePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid: jsii.String("StartRuns"), Actions: jsii.Strings("states:StartExecution"),
		Resources: &[]*string{s.stateMachine.StateMachineArn()},
	}))
	api.AddToRolePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid: jsii.String("CancelRuns"), Actions: jsii.Strings("states:StopExecution", "states:DescribeExecution"),
		Resources: &[]*string{s.executionsArn()},
	}))
	cleanup := s.fns[fnCleanup]
	cleanup.AddEnvironment(jsii.String(envStateMachineARN), s.stateMachine.StateMachineArn(), nil)

	// Cleanup runs asynchronously: an event EventBridge cannot deliver, and
	// an invocation that still fails after Lambda's retries, land in this
	// queue, whose depth alarms (alarms.go).
	s.cleanupDLQ = awssqs.NewQueue(s.stack, jsii.String("CleanupDeadLetters"), &awssqs.QueueProps{
		Encryption:      awssqs.QueueEncryption_SQS_MANAGED,
		EnforceSSL:      jsii.Bool(true),
		RetentionPeriod: awscdk.Duration_Days(jsii.Number(14)),
	})
	awslambda.NewEventInvokeConfig(s.stack, jsii.String("CleanupAsync"), &awslambda.EventInvokeConfigProps{
		Function:      cleanup,
		RetryAttempts: jsii.Number(2),
		MaxEventAge:   awscdk.Duration_Hours(jsii.Number(6)),
		OnFailure:     awslambdadestinations.NewSqsDestination(s.cleanupDLQ),
	})
	awsevents.NewRule(s.stack, jsii.String("ExecutionEnded"), &awsevents.RuleProps{
		Description: jsii.String("belay: a run's execution was aborted, timed out or failed; cleanup finalizes the run and stops its task"),
		EventPattern: &awsevents.EventPattern{
			Source:     jsii.Strings("aws.states"),
			DetailType: jsii.Strings("Step Functions Execution Status Change"),
			Detail: &map[string]any{
				"status":          []string{"ABORTED", "TIMED_OUT", "FAILED"},
				"stateMachineArn": []*string{s.stateMachine.StateMachineArn()},
			},
		},
		Targets: &[]awsevents.IRuleTarget{awseventstargets.NewLambdaFunction(cleanup, &awseventstargets.LambdaFunctionProps{
			DeadLetterQueue: s.cleanupDLQ,
			RetryAttempts:   jsii.Number(8),
			MaxEventAge:     awscdk.Duration_Hours(jsii.Number(6)),
		})},
	})
	return nil
}

// executionsArn names every execution of the state machine: their names
// are run ids, known only at run time.
func (s *belayStack) executionsArn() *string {
	return awscdk.Fn_Sub(jsii.String("arn:${AWS::Partition}:states:${AWS::Region}:${AWS::AccountId}:execution:${Name}:*"),
		&map[string]*string{"Name": s.stateMachine.StateMachineName()})
}
