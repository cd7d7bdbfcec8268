package main

import (
	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatch"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatchactions"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssns"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssnssubscriptions"
	"github.com/aws/jsii-runtime-go"
)

// alarms raises what an operator must hear about, to one SNS topic (with
// -c alarmEmail=ADDRESS, subscribed by email):
//   - a failed cleanup: the cleanup function's errors, and any message in
//     its dead-letter queue (an aborted run that may still hold a task or
//     an active capability);
//   - every function's errors and throttles;
//   - executions that failed or timed out (Fail ran, or nothing could).
func (s *belayStack) alarms() {
	s.alarmTopic = awssns.NewTopic(s.stack, jsii.String("Alarms"), &awssns.TopicProps{
		DisplayName: jsii.String("belay alarms"),
		EnforceSSL:  jsii.Bool(true),
	})
	// CloudWatch publishes the alarms; nothing else may.
	s.alarmTopic.AddToResourcePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:        jsii.String("CloudWatchAlarms"),
		Principals: &[]awsiam.IPrincipal{awsiam.NewServicePrincipal(jsii.String("cloudwatch.amazonaws.com"), nil)},
		Actions:    jsii.Strings("sns:Publish"),
		Resources:  &[]*string{s.alarmTopic.TopicArn()},
		Conditions: &map[string]any{"StringEquals": map[string]any{"aws:SourceAccount": s.stack.Account()}},
	}))
	if s.cfg.AlarmEmail != "" {
		s.alarmTopic.AddSubscription(awssnssubscriptions.NewEmailSubscription(jsii.String(s.cfg.AlarmEmail), nil))
	}
	action := awscloudwatchactions.NewSnsAction(s.alarmTopic)
	alarm := func(id, what string, m awscloudwatch.IMetric) {
		a := awscloudwatch.NewAlarm(s.stack, jsii.String(id), &awscloudwatch.AlarmProps{
			AlarmDescription:   jsii.String("belay: " + what),
			Metric:             m,
			Threshold:          jsii.Number(1),
			EvaluationPeriods:  jsii.Number(1),
			ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
			TreatMissingData:   awscloudwatch.TreatMissingData_NOT_BREACHING,
		})
		a.AddAlarmAction(action)
	}
	fiveMinutes := &awscloudwatch.MetricOptions{Period: awscdk.Duration_Minutes(jsii.Number(5)), Statistic: jsii.String("Sum")}

	alarm("CleanupFailedAlarm", "the cleanup function failed: an aborted or timed-out run may still hold its task or an active capability",
		s.fns[fnCleanup].MetricErrors(fiveMinutes))
	alarm("CleanupDeadLettersAlarm", "cleanup events are in the dead-letter queue: those runs were not cleaned up; replay them after fixing the cause",
		s.cleanupDLQ.MetricApproximateNumberOfMessagesVisible(fiveMinutes))
	for _, name := range functionNames {
		fn := s.fns[name]
		id := functionID(name)
		if name != fnCleanup {
			alarm(id+"Errors", "the "+name+" function returned errors", fn.MetricErrors(fiveMinutes))
		}
		alarm(id+"Throttles", "the "+name+" function was throttled", fn.MetricThrottles(fiveMinutes))
	}
	alarm("ExecutionsFailed", "run executions failed (a step failed, or the Fail step could not finalize the run)",
		s.stateMachine.MetricFailed(fiveMinutes))
	alarm("ExecutionsTimedOut", "run executions timed out as a whole", s.stateMachine.MetricTimedOut(fiveMinutes))
}
