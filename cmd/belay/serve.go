package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"

	"github.com/belay-dev/belay/internal/anthropic"
	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/embedded"
)

const serveDoc = `Runs the embedded control plane: the public API and the model proxy on
one address, runs in SQLite under the data directory, each run's sandbox as
the sandbox image under runc with the Fargate task's hardening (the OCI
launcher). Flags override the BELAY_* variables named in their help.

The OCI launcher needs root, runc (apt-get install runc) and the image
(make image writes bin/belay-sandbox.oci.tar beside bin/belay; or
--sandbox-image). Where it cannot run, belay serve refuses to start, unless
--allow-weak-isolation accepts the process launcher: each sandbox then runs
as a namespaced host subprocess that shares the host's file system and
/tmp, sees the host's /proc, has no seccomp filter and can reach the
host's Unix sockets. --launcher picks one explicitly.

SIGINT or SIGTERM shuts down gracefully: in-flight requests finish,
running sandboxes are stopped, and their runs resume on new sandboxes from
their latest checkpoints at the next start (with --max-resumes 0 they are
recorded as failed instead); queued runs start again on the next start. A
run whose sandbox dies (killed, out of memory) resumes the same way, at
most --max-resumes times.

With --store dynamodb --table T, runs live in a DynamoDB table instead, and
with --bucket B artifacts live in an S3 bucket: the AWS deployment's own
adapters, under the same API. Credentials and region come from the default
AWS configuration (AWS_REGION, AWS_PROFILE, instance role), unless
--aws-endpoint names a local peer such as DynamoDB Local (and --s3-endpoint
an S3 one, when it is another). The table must exist, or pass
--create-table; the bucket must exist. Serve one table from one belay at a
time: at start it ends the runs a previous process left running.

The model provider is OpenAI-compatible by default; --model-provider
anthropic speaks Anthropic's Messages API (the key as for openai), and
--model-provider bedrock Amazon Bedrock's Converse API, signed with the
default AWS credentials (no key). The sandbox speaks chat completions to
belay whichever it is.

With --triggers, GitHub's webhooks are served at POST /v1/webhooks/github
(signed with BELAY_GITHUB_WEBHOOK_SECRET), and runs they start get safe
outputs: a branch belay/<runId>, a pull request and a comment.

The provider key, the control-plane token, the webhook secret and the git
and GitHub credentials are not flags, so they never show in a process
listing: set BELAY_MODEL_API_KEY (or a key file), BELAY_TOKEN,
BELAY_GITHUB_WEBHOOK_SECRET, BELAY_GIT_CREDENTIALS and BELAY_GITHUB_TOKEN (or
their _FILE variants) in the environment.`

// cmdServe runs `belay serve` until ctx ends (SIGINT, SIGTERM).
func cmdServe(ctx context.Context, e *env, args []string) error {
	cfg := embedded.ConfigFromEnv(e.lookup)
	fs := newFlagSet(e, "serve", "[flags]", serveDoc)
	fs.StringVar(&cfg.Addr, "addr", cfg.Addr, "listen `host:port` (BELAY_ADDR; default "+embedded.DefaultAddr+")")
	fs.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir,
		"data `directory`: database, artifacts, token files (BELAY_DATA_DIR; as root "+embedded.DefaultRootDataDir+", else ~/.local/share/belay)")
	fs.StringVar(&cfg.Model, "model", cfg.Model, "the one `model` runs may use (BELAY_MODEL)")
	fs.StringVar(&cfg.Provider.Kind, "model-provider", cfg.Provider.Kind,
		"the model provider: openai (any OpenAI-compatible API), anthropic or bedrock (BELAY_MODEL_PROVIDER; default openai)")
	fs.StringVar(&cfg.ModelAPIURL, "model-api-url", cfg.ModelAPIURL,
		"the provider's `URL`: openai, the chat-completions URL; anthropic, the API's base URL (default "+anthropic.DefaultBaseURL+
			"); bedrock, an endpoint override; https, or http to a loopback address (BELAY_MODEL_API_URL)")
	fs.StringVar(&cfg.Provider.BedrockRegion, "bedrock-region", cfg.Provider.BedrockRegion,
		"AWS `region` of Bedrock (BELAY_BEDROCK_REGION; default AWS_REGION or the profile's)")
	fs.StringVar(&cfg.ModelAPIKeyFile, "model-api-key-file", cfg.ModelAPIKeyFile,
		"`file` holding the provider key, mode 0600 (BELAY_MODEL_API_KEY_FILE)")
	fs.StringVar(&cfg.Launcher, "launcher", cfg.Launcher,
		"sandbox launcher: oci or process (BELAY_LAUNCHER; default oci when runc, the image and root are here)")
	fs.BoolVar(&cfg.AllowWeakIsolation, "allow-weak-isolation", cfg.AllowWeakIsolation,
		"accept the process launcher's weaker isolation: host file system, /tmp, /proc and Unix sockets, no seccomp (BELAY_ALLOW_WEAK_ISOLATION=1)")
	fs.StringVar(&cfg.SandboxImage, "sandbox-image", cfg.SandboxImage,
		"the OCI launcher's sandbox image `archive` (BELAY_SANDBOX_IMAGE; default "+embedded.SandboxImageName+" beside belay)")
	fs.StringVar(&cfg.ImageCache, "image-cache", cfg.ImageCache,
		"`folder` the OCI launcher unpacks the image into, searchable from / (BELAY_IMAGE_CACHE; default "+embedded.DefaultRootImageCache+" with the default data directory, else <data dir>/images)")
	fs.StringVar(&cfg.SandboxBin, "sandbox-bin", cfg.SandboxBin,
		"the process launcher's sandbox entry `binary` (BELAY_SANDBOX_BIN; default belay-sandbox beside belay, else on PATH)")
	fs.StringVar(&cfg.SandboxDir, "sandbox-dir", cfg.SandboxDir,
		"`directory` of the sandbox workspaces, below no folder a sandbox may write (BELAY_SANDBOX_DIR; default <data dir>/sandboxes, "+
			embedded.DefaultRootSandboxDir+" beside "+embedded.DefaultRootDataDir+")")
	fs.StringVar(&cfg.ScriptedModel, "scripted-model", cfg.ScriptedModel,
		"serve this scripted model session `file` as the upstream, for offline demos (BELAY_SCRIPTED_MODEL)")
	fs.StringVar(&cfg.Storage.Store, "store", cfg.Storage.Store,
		"where runs live: sqlite (in the data directory) or dynamodb (BELAY_STORE; default sqlite)")
	fs.StringVar(&cfg.Storage.Table, "table", cfg.Storage.Table, "DynamoDB `table` of --store dynamodb (BELAY_DYNAMODB_TABLE)")
	fs.BoolVar(&cfg.Storage.CreateTable, "create-table", false, "create the DynamoDB table if it does not exist")
	fs.StringVar(&cfg.Storage.Bucket, "bucket", cfg.Storage.Bucket,
		"keep artifacts in this S3 `bucket` instead of the data directory (BELAY_S3_BUCKET)")
	fs.StringVar(&cfg.Storage.AWSEndpoint, "aws-endpoint", cfg.Storage.AWSEndpoint,
		"`URL` of a local AWS peer such as DynamoDB Local, instead of AWS (BELAY_AWS_ENDPOINT)")
	fs.StringVar(&cfg.Storage.S3Endpoint, "s3-endpoint", cfg.Storage.S3Endpoint,
		"`URL` of a local S3 peer (BELAY_S3_ENDPOINT; default --aws-endpoint)")
	var extensions, checks stringList
	fs.Var(&extensions, "allow-extension", "also accept uploaded files with this `extension`, such as .kt (repeatable; adds to BELAY_EXTENSIONS)")
	fs.Var(&checks, "allow-check", "also allowlist this check `command`, split on spaces, such as \"go test ./...\" (repeatable; adds to BELAY_CHECKS)")
	fs.StringVar(&cfg.Isolation, "isolation", "auto", "sandbox isolation: auto (all the machine allows) or none")
	fs.IntVar(&cfg.EventBufferSize, "event-buffer", 0, "events kept per run (default 2000)")
	fs.IntVar(&cfg.SandboxEventLimits.MaxEvents, "sandbox-events", cfg.SandboxEventLimits.MaxEvents,
		"most events a run's sandbox may append (BELAY_SANDBOX_EVENTS; default 1000)")
	fs.Int64Var(&cfg.SandboxEventLimits.MaxBytes, "sandbox-event-bytes", cfg.SandboxEventLimits.MaxBytes,
		"most `bytes` of events a run's sandbox may append (BELAY_SANDBOX_EVENT_BYTES; default 4194304)")
	fs.Func("max-resumes", fmt.Sprintf("most times a run whose sandbox was lost resumes on a new one, 0 to %d; 0 turns resumes off (BELAY_MAX_RESUMES; default %d)",
		embedded.MaxMaxResumes, belay.DefaultMaxResumes), func(v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > embedded.MaxMaxResumes {
			return fmt.Errorf("must be a whole number from 0 to %d", embedded.MaxMaxResumes)
		}
		cfg.MaxResumes = &n
		return nil
	})
	fs.StringVar(&cfg.RepoEvents.Triggers, "triggers", cfg.RepoEvents.Triggers,
		"triggers `file` (or its JSON): which repositories' events start runs; enables POST /v1/webhooks/github (BELAY_TRIGGERS)")
	fs.IntVar(&cfg.RepoEvents.RepoMaxFiles, "repo-max-files", cfg.RepoEvents.RepoMaxFiles,
		"most files a git source's commit may hold (BELAY_REPO_MAX_FILES; default 20000)")
	fs.Int64Var(&cfg.RepoEvents.RepoMaxBytes, "repo-max-bytes", cfg.RepoEvents.RepoMaxBytes,
		"most `bytes` of a git source's files, and of its bundle (BELAY_REPO_MAX_BYTES; default 104857600)")
	fs.StringVar(&cfg.RepoEvents.GitHubAPIURL, "github-api-url", cfg.RepoEvents.GitHubAPIURL,
		"GitHub's REST API `URL` for pull requests and comments (BELAY_GITHUB_API_URL; default https://api.github.com/)")
	fs.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", embedded.DefaultShutdownTimeout,
		"bound on each stage of a graceful shutdown")
	if _, err := parseExact(fs, args); err != nil {
		return err
	}
	cfg.Limits.Extensions = append(cfg.Limits.Extensions, extensions...)
	for _, c := range checks {
		argv := belay.ParseCheck(c)
		if len(argv) == 0 {
			return usagef("--allow-check %q is empty", c)
		}
		cfg.Limits.Checks = append(cfg.Limits.Checks, argv)
	}
	cfg.Logger = newLogger(e.stderr)

	m, err := embedded.New(cfg)
	if err != nil {
		return err
	}
	ran := make(chan error, 1)
	go func() { ran <- m.Run(ctx) }()
	<-m.Ready()
	if m.Addr() == "" {
		return <-ran
	}
	printServing(e.stdout, m, cfg)
	if err := <-ran; err != nil {
		return err
	}
	fmt.Fprintln(e.stdout, "belay: stopped")
	return nil
}

// printServing tells the operator where the server is, where its token is
// (never the token), and what isolation each sandbox gets, in one write, so
// whoever reads the output line by line (a supervisor, a test waiting for
// "serving on") never sees the first line without the rest.
func printServing(out io.Writer, m *embedded.Main, cfg embedded.Config) {
	var w bytes.Buffer
	defer func() { _, _ = out.Write(w.Bytes()) }()
	endpoint := "http://" + m.Addr()
	fmt.Fprintf(&w, "belay %s serving on %s\n", version, endpoint)
	fmt.Fprintf(&w, "  model:      %s, through %s\n", m.Model(), m.Upstream())
	fmt.Fprintf(&w, "  data:       %s\n", m.DataDir())
	fmt.Fprintf(&w, "  sandboxes:  %s\n", m.SandboxDir())
	runs, artifacts := m.Storage()
	fmt.Fprintf(&w, "  runs:       %s\n", runs)
	fmt.Fprintf(&w, "  artifacts:  %s\n", artifacts)
	if f := m.TokenFile(); f != "" {
		fmt.Fprintf(&w, "  token:      in %s (mode 0600; the CLI reads it from there)\n", f)
	} else {
		fmt.Fprintf(&w, "  token:      from %s\n", embedded.EnvToken)
	}
	kind, why := m.Launcher()
	fmt.Fprintf(&w, "  launcher:   %s (%s)\n", kind, why)
	if img := m.SandboxImage(); img != "" {
		fmt.Fprintf(&w, "  image:      %s\n", img)
	} else {
		fmt.Fprintf(&w, "  sandbox:    %s\n", m.SandboxBin())
		fmt.Fprintf(&w, "  WARNING:    weaker isolation accepted: %s\n", embedded.WeakIsolation)
	}
	fmt.Fprintln(&w, "  isolation:")
	for _, s := range m.Isolation() {
		fmt.Fprintf(&w, "    - %s\n", s)
	}
	if missing := m.NotApplied(); len(missing) > 0 {
		fmt.Fprintln(&w, "  not applied:")
		for _, s := range missing {
			fmt.Fprintf(&w, "    - %s\n", s)
		}
	}
	if endpoint != defaultEndpoint {
		fmt.Fprintf(&w, "  clients:    export %s=%s\n", envEndpoint, endpoint)
	}
}

// newLogger logs text to a terminal and JSON otherwise (to a file or a log
// collector), at info level.
func newLogger(w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: slog.LevelInfo}
	if isTerminal(w) {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

// isTerminal reports whether w is a character device, such as a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
