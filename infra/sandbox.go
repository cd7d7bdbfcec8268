package main

import (
	"strconv"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsecr"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsecs"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslogs"
	"github.com/aws/jsii-runtime-go"

	"github.com/belay-dev/belay/internal/hardening"
)

// sandboxContainer is the task's one container, the name the state
// machine's RunTask overrides address.
const sandboxContainer = "sandbox"

// placeholderDigest is the SandboxImageDigest parameter's default when
// synthesis had no image (context sandboxImageDigest unset): a task started
// with it fails to pull, so the stack is deployable but runs nothing until
// scripts/deploy.sh pins the pushed image.
const placeholderDigest = "sha256:0000000000000000000000000000000000000000000000000000000000000000"

// The scratch volumes: Fargate has no tmpfs, so the only writable paths of
// the read-only root filesystem are task-storage volumes.
const (
	volumeWorkspace = "workspace"
	volumeTmp       = "tmp"
)

// newCluster builds the ECS cluster the sandbox tasks run in. It comes
// before the functions, since cleanup stops tasks in it.
func newCluster(s *belayStack) awsecs.Cluster {
	return awsecs.NewCluster(s.stack, jsii.String("Cluster"), &awsecs.ClusterProps{
		Vpc:                 s.vpc,
		ContainerInsightsV2: awsecs.ContainerInsights_ENABLED,
	})
}

// clusterTasksArn names every task of the cluster: the narrowest resource
// for stopping or describing a task whose id is known only at run time.
func (s *belayStack) clusterTasksArn() *string {
	return awscdk.Fn_Sub(jsii.String("arn:${AWS::Partition}:ecs:${AWS::Region}:${AWS::AccountId}:task/${Cluster}/*"),
		&map[string]*string{"Cluster": s.cluster.ClusterName()})
}

// sandbox builds the image repository and the Fargate task definition,
// made from hardening.Sandbox (the same value the local runc config is made
// from): the non-root user, a read-only root filesystem with scratch volumes
// for the workspace and /tmp, every capability dropped, an init process,
// the ulimits, CPU and memory. ECS Exec stays off: the RunTask state never
// enables it and the task role holds no ssmmessages permission.
func (s *belayStack) sandbox() {
	h := hardening.Sandbox
	s.repo = awsecr.NewRepository(s.stack, jsii.String("SandboxRepository"), &awsecr.RepositoryProps{
		ImageScanOnPush:    jsii.Bool(true),
		ImageTagMutability: awsecr.TagMutability_IMMUTABLE,
		LifecycleRules: &[]*awsecr.LifecycleRule{{
			Description:   jsii.String("keep the last 10 sandbox images; the task definition pins one of them by digest"),
			TagStatus:     awsecr.TagStatus_ANY,
			MaxImageCount: jsii.Number(10),
		}},
		// The image is rebuilt from sandbox-task/ by make image.
		EmptyOnDelete: jsii.Bool(true),
		RemovalPolicy: awscdk.RemovalPolicy_DESTROY,
	})

	s.imageDigest = jsii.String(s.cfg.ImageDigest)
	if s.cfg.ImageDigest == "" {
		p := awscdk.NewCfnParameter(s.stack, jsii.String("SandboxImageDigest"), &awscdk.CfnParameterProps{
			Type:           jsii.String("String"),
			Default:        jsii.String(placeholderDigest),
			AllowedPattern: jsii.String("^sha256:[0-9a-f]{64}$"),
			Description:    jsii.String("The sandbox image's digest in the SandboxRepository. scripts/deploy.sh sets it (context sandboxImageDigest); the placeholder runs nothing."),
		})
		s.imageDigest = p.ValueAsString()
		awscdk.Annotations_Of(s.stack).AddWarningV2(jsii.String("belay:placeholder-image"),
			jsii.String("no sandbox image digest (context sandboxImageDigest): the task definition takes the SandboxImageDigest parameter, whose default is a placeholder; make deploy builds, pushes and pins the image"), nil)
	}

	s.sandboxLogs = awslogs.NewLogGroup(s.stack, jsii.String("SandboxLogs"), &awslogs.LogGroupProps{
		Retention:     retention(s.cfg.LogRetentionDays),
		RemovalPolicy: awscdk.RemovalPolicy_DESTROY,
	})

	// The task role: the sandbox's AWS identity. It may invoke the private
	// API's internal routes and nothing else; the routes themselves admit a
	// task only with its claim and then its run tokens.
	taskRole := awsiam.NewRole(s.stack, jsii.String("SandboxTaskRole"), &awsiam.RoleProps{
		AssumedBy: awsiam.NewServicePrincipal(jsii.String("ecs-tasks.amazonaws.com"), &awsiam.ServicePrincipalOpts{
			Conditions: &map[string]any{
				"StringEquals": map[string]any{"aws:SourceAccount": s.stack.Account()},
			},
		}),
		Description: jsii.String("belay sandbox task: the private API's internal routes only"),
	})
	taskRole.AddToPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:       jsii.String("InternalRoutesOnly"),
		Actions:   jsii.Strings("execute-api:Invoke"),
		Resources: &[]*string{s.privateAPI.ArnForExecuteApi(jsii.String("*"), jsii.String("/internal/*"), s.privateAPI.DeploymentStage().StageName())},
	}))

	arch := awsecs.CpuArchitecture_ARM64()
	if !s.cfg.ARM64 {
		arch = awsecs.CpuArchitecture_X86_64()
	}
	s.taskDef = awsecs.NewFargateTaskDefinition(s.stack, jsii.String("SandboxTask"), &awsecs.FargateTaskDefinitionProps{
		Family:              jsii.String("belay-sandbox"),
		Cpu:                 jsii.Number(float64(s.cfg.SandboxCPU)),
		MemoryLimitMiB:      jsii.Number(float64(s.cfg.SandboxMemoryMiB)),
		EphemeralStorageGiB: jsii.Number(float64(h.EphemeralStorageGiB)),
		RuntimePlatform: &awsecs.RuntimePlatform{
			CpuArchitecture:       arch,
			OperatingSystemFamily: awsecs.OperatingSystemFamily_LINUX(),
		},
		TaskRole: taskRole,
		Volumes: &[]*awsecs.Volume{
			{Name: jsii.String(volumeWorkspace)},
			{Name: jsii.String(volumeTmp)},
		},
	})

	linux := awsecs.NewLinuxParameters(s.stack, jsii.String("SandboxLinux"), &awsecs.LinuxParametersProps{
		InitProcessEnabled: jsii.Bool(h.InitProcess),
	})
	if h.DropAllCapabilities {
		linux.DropCapabilities(awsecs.Capability_ALL)
	}
	ctr := s.taskDef.AddContainer(jsii.String(sandboxContainer), &awsecs.ContainerDefinitionOptions{
		ContainerName:          jsii.String(sandboxContainer),
		Image:                  awsecs.ContainerImage_FromRegistry(s.repo.RepositoryUriForDigest(s.imageDigest), nil),
		EntryPoint:             jsii.Strings(h.Entrypoint...),
		User:                   jsii.String(strconv.Itoa(h.UID) + ":" + strconv.Itoa(h.GID)),
		ReadonlyRootFilesystem: jsii.Bool(h.ReadOnlyRootFS),
		Privileged:             jsii.Bool(false),
		LinuxParameters:        linux,
		Essential:              jsii.Bool(true),
		MemoryLimitMiB:         jsii.Number(float64(s.cfg.SandboxMemoryMiB)),
		// The claim (BELAY_CLAIM) is the only per-run input, a RunTask
		// override. The API's base URL is the same for every task.
		Environment: &map[string]*string{
			"BELAY_API_URL": s.privateAPIBaseURL(),
		},
		Ulimits: &[]*awsecs.Ulimit{
			{Name: awsecs.UlimitName_NPROC, SoftLimit: jsii.Number(float64(h.Processes)), HardLimit: jsii.Number(float64(h.Processes))},
			{Name: awsecs.UlimitName_NOFILE, SoftLimit: jsii.Number(float64(h.OpenFiles)), HardLimit: jsii.Number(float64(h.OpenFiles))},
			{Name: awsecs.UlimitName_FSIZE, SoftLimit: jsii.Number(float64(h.FileSizeMiB) * 1024 * 1024), HardLimit: jsii.Number(float64(h.FileSizeMiB) * 1024 * 1024)},
		},
		// On cancel the entry gets SIGTERM and this long to stop its
		// checks before SIGKILL.
		StopTimeout: awscdk.Duration_Seconds(jsii.Number(30)),
		Logging: awsecs.LogDriver_AwsLogs(&awsecs.AwsLogDriverProps{
			LogGroup:     s.sandboxLogs,
			StreamPrefix: jsii.String("sandbox"),
		}),
	})
	ctr.AddMountPoints(
		&awsecs.MountPoint{SourceVolume: jsii.String(volumeWorkspace), ContainerPath: jsii.String(h.WorkspaceDir), ReadOnly: jsii.Bool(false)},
		&awsecs.MountPoint{SourceVolume: jsii.String(volumeTmp), ContainerPath: jsii.String(h.TmpDir), ReadOnly: jsii.Bool(false)},
	)
	// Fargate pulls with the execution role: belay's repository only (the
	// authorization token has no narrower resource).
	s.repo.GrantPull(s.taskDef.ObtainExecutionRole())
}
