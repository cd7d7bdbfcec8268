package main

import (
	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsec2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslogs"
	"github.com/aws/jsii-runtime-go"
)

// network builds the sandbox's VPC (DESIGN.md "Architecture": no internet
// route, VPC endpoints only). Its subnets are isolated: no NAT gateway, no
// internet gateway, so a route table holds the VPC's local route and the S3
// gateway endpoint's prefix list and nothing else. The Lambda functions are
// not in the VPC: they reach DynamoDB, S3, Secrets Manager and the model
// provider as any Lambda does.
//
// Everything the task needs goes through an endpoint: the image from ECR
// (api and dkr, layers from S3 through the gateway), its logs to CloudWatch
// Logs, and the internal routes on the private API (execute-api). Each
// endpoint's policy narrows it to this account's resources, so a sandbox
// holding someone else's credentials cannot use it to write to their bucket,
// log group or private API.
func (s *belayStack) network() {
	flowLogs := awslogs.NewLogGroup(s.stack, jsii.String("VpcFlowLogs"), &awslogs.LogGroupProps{
		Retention:     retention(s.cfg.LogRetentionDays),
		RemovalPolicy: awscdk.RemovalPolicy_DESTROY,
	})
	s.vpc = awsec2.NewVpc(s.stack, jsii.String("Vpc"), &awsec2.VpcProps{
		IpAddresses: awsec2.IpAddresses_Cidr(jsii.String("10.80.0.0/16")),
		MaxAzs:      jsii.Number(float64(s.cfg.AZCount)),
		NatGateways: jsii.Number(0),
		// Only isolated subnets: CDK then creates no internet gateway.
		SubnetConfiguration: &[]*awsec2.SubnetConfiguration{{
			Name:       jsii.String("sandbox"),
			SubnetType: awsec2.SubnetType_PRIVATE_ISOLATED,
			CidrMask:   jsii.Number(22),
		}},
		CreateInternetGateway: jsii.Bool(false),
		// Nothing uses the default security group; restricting it would
		// add a custom-resource Lambda to the stack for no gain.
		RestrictDefaultSecurityGroup: jsii.Bool(false),
		FlowLogs: &map[string]*awsec2.FlowLogOptions{
			// Every accepted and rejected flow: a sandbox trying to reach
			// anything else shows up here.
			"All": {
				Destination: awsec2.FlowLogDestination_ToCloudWatchLogs(flowLogs, nil),
				TrafficType: awsec2.FlowLogTrafficType_ALL,
			},
		},
	})
	s.sandboxSubnets = &awsec2.SubnetSelection{SubnetType: awsec2.SubnetType_PRIVATE_ISOLATED}

	s.sandboxSG = awsec2.NewSecurityGroup(s.stack, jsii.String("SandboxSecurityGroup"), &awsec2.SecurityGroupProps{
		Vpc:              s.vpc,
		Description:      jsii.String("belay sandbox tasks: HTTPS out to the VPC endpoints only; nothing in"),
		AllowAllOutbound: jsii.Bool(false),
	})
	endpointSG := awsec2.NewSecurityGroup(s.stack, jsii.String("EndpointSecurityGroup"), &awsec2.SecurityGroupProps{
		Vpc:              s.vpc,
		Description:      jsii.String("belay VPC interface endpoints: HTTPS from the sandbox tasks"),
		AllowAllOutbound: jsii.Bool(false),
	})
	endpointSG.AddIngressRule(s.sandboxSG, awsec2.Port_Tcp(jsii.Number(443)), jsii.String("sandbox tasks"), nil)
	s.sandboxSG.AddEgressRule(endpointSG, awsec2.Port_Tcp(jsii.Number(443)), jsii.String("interface endpoints (ECR, logs, private API)"), nil)
	// The S3 gateway endpoint has no address of its own: its prefix list is
	// the destination, and CloudFormation cannot name that list without a
	// lookup. With no internet or NAT route, 443 to anywhere reaches only
	// what the route tables hold: the VPC and the S3 gateway.
	s.sandboxSG.AddEgressRule(awsec2.Peer_AnyIpv4(), awsec2.Port_Tcp(jsii.Number(443)), jsii.String("S3 through the gateway endpoint (the only non-local route)"), nil)

	endpoint := func(id string, svc awsec2.IInterfaceVpcEndpointService) awsec2.InterfaceVpcEndpoint {
		return s.vpc.AddInterfaceEndpoint(jsii.String(id), &awsec2.InterfaceVpcEndpointOptions{
			Service:           svc,
			Subnets:           s.sandboxSubnets,
			SecurityGroups:    &[]awsec2.ISecurityGroup{endpointSG},
			PrivateDnsEnabled: jsii.Bool(true),
			Open:              jsii.Bool(false),
		})
	}
	s.ecrAPIVpce = endpoint("EcrApiEndpoint", awsec2.InterfaceVpcEndpointAwsService_ECR())
	s.ecrDkrVpce = endpoint("EcrDkrEndpoint", awsec2.InterfaceVpcEndpointAwsService_ECR_DOCKER())
	s.logsVpce = endpoint("LogsEndpoint", awsec2.InterfaceVpcEndpointAwsService_CLOUDWATCH_LOGS())
	s.executeAPIVpce = endpoint("ExecuteApiEndpoint", awsec2.InterfaceVpcEndpointAwsService_APIGATEWAY())
	s.s3Vpce = s.vpc.AddGatewayEndpoint(jsii.String("S3Endpoint"), &awsec2.GatewayVpcEndpointOptions{
		Service: awsec2.GatewayVpcEndpointAwsService_S3(),
		Subnets: &[]*awsec2.SubnetSelection{s.sandboxSubnets},
	})
}

// endpointPolicies narrows each endpoint to what the sandbox task (and
// Fargate on its behalf) uses, once the bucket, repository and log group
// exist.
func (s *belayStack) endpointPolicies() {
	any := awsiam.NewAnyPrincipal()
	allow := func(actions []string, resources ...*string) awsiam.PolicyStatement {
		return awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
			Principals: &[]awsiam.IPrincipal{any},
			Actions:    jsii.Strings(actions...),
			Resources:  &resources,
		})
	}
	// Pulling the image: a token (no resource-level permission exists for
	// it), then the manifest and layers of belay's repository only.
	s.ecrAPIVpce.AddToPolicy(allow([]string{"ecr:GetAuthorizationToken"}, jsii.String("*")))
	for _, e := range []awsec2.InterfaceVpcEndpoint{s.ecrAPIVpce, s.ecrDkrVpce} {
		e.AddToPolicy(allow([]string{"ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"}, s.repo.RepositoryArn()))
	}
	// ECR serves layers from its own bucket; the sandbox uploads its outputs
	// to presigned URLs of the artifact bucket. No other bucket.
	s.s3Vpce.AddToPolicy(allow([]string{"s3:GetObject"},
		awscdk.Fn_Sub(jsii.String("arn:${AWS::Partition}:s3:::prod-${AWS::Region}-starport-layer-bucket/*"), nil)))
	s.s3Vpce.AddToPolicy(allow([]string{"s3:PutObject"}, s.bucket.ArnForObjects(jsii.String("runs/*"))))
	// The task's log stream, written by Fargate with the execution role.
	s.logsVpce.AddToPolicy(allow([]string{"logs:CreateLogStream", "logs:PutLogEvents"}, s.sandboxLogs.LogGroupArn()))
	// Private APIs of this account only (the private API's own resource
	// policy then admits only this endpoint).
	s.executeAPIVpce.AddToPolicy(allow([]string{"execute-api:Invoke"},
		awscdk.Fn_Sub(jsii.String("arn:${AWS::Partition}:execute-api:${AWS::Region}:${AWS::AccountId}:*"), nil)))
}

// retention is the log retention for days, rounded up to a value
// CloudWatch Logs accepts.
func retention(days int) awslogs.RetentionDays {
	steps := []struct {
		days int
		r    awslogs.RetentionDays
	}{
		{1, awslogs.RetentionDays_ONE_DAY}, {3, awslogs.RetentionDays_THREE_DAYS}, {5, awslogs.RetentionDays_FIVE_DAYS},
		{7, awslogs.RetentionDays_ONE_WEEK}, {14, awslogs.RetentionDays_TWO_WEEKS}, {30, awslogs.RetentionDays_ONE_MONTH},
		{60, awslogs.RetentionDays_TWO_MONTHS}, {90, awslogs.RetentionDays_THREE_MONTHS}, {120, awslogs.RetentionDays_FOUR_MONTHS},
		{150, awslogs.RetentionDays_FIVE_MONTHS}, {180, awslogs.RetentionDays_SIX_MONTHS}, {365, awslogs.RetentionDays_ONE_YEAR},
		{400, awslogs.RetentionDays_THIRTEEN_MONTHS}, {545, awslogs.RetentionDays_EIGHTEEN_MONTHS},
		{731, awslogs.RetentionDays_TWO_YEARS}, {1827, awslogs.RetentionDays_FIVE_YEARS}, {3653, awslogs.RetentionDays_TEN_YEARS},
	}
	for _, st := range steps {
		if days <= st.days {
			return st.r
		}
	}
	return awslogs.RetentionDays_TEN_YEARS
}
