package embedded

import (
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/dispatch"
	"github.com/belay-dev/belay/internal/localsandbox"
)

// The environment variables `belay serve` reads (DESIGN.md "Embedded
// configuration"). The CLI reads EnvToken and EnvDataDir too, to find the
// control-plane token.
const (
	EnvAddr          = "BELAY_ADDR"
	EnvDataDir       = "BELAY_DATA_DIR"
	EnvModel         = "BELAY_MODEL"
	EnvModelAPIURL   = "BELAY_MODEL_API_URL"
	EnvModelAPIKey   = "BELAY_MODEL_API_KEY"
	EnvModelKeyFile  = "BELAY_MODEL_API_KEY_FILE"
	EnvToken         = "BELAY_TOKEN"
	EnvSandboxBin    = "BELAY_SANDBOX_BIN"
	EnvSandboxDir    = "BELAY_SANDBOX_DIR"
	EnvScriptedModel = "BELAY_SCRIPTED_MODEL"
	// EnvSandboxEvents and EnvSandboxEventBytes cap what each run's sandbox
	// may append to its log (belay.SandboxEventLimits).
	EnvSandboxEvents     = "BELAY_SANDBOX_EVENTS"
	EnvSandboxEventBytes = "BELAY_SANDBOX_EVENT_BYTES"
	// EnvMaxResumes is how many times a run whose sandbox was lost (or
	// that a restart interrupted) resumes on a new sandbox, at most.
	EnvMaxResumes = belay.EnvMaxResumes
)

// Defaults of Config.
const (
	DefaultAddr            = "127.0.0.1:8700"
	DefaultShutdownTimeout = 30 * time.Second
	// DefaultScriptedModelName is the model a scripted session serves when
	// no model is configured: a script answers whatever model it is asked.
	DefaultScriptedModelName = "belay-scripted"
	// SandboxBinName is the sandbox entry's file name, looked up beside the
	// running executable and then on PATH.
	SandboxBinName = "belay-sandbox"
)

// Names of the files in the data directory.
const (
	// ControlTokenFile holds the control-plane token written on first
	// start (when BELAY_TOKEN is not set), mode 0600.
	ControlTokenFile = "control-token"
	// SigningKeyFile holds the HMAC secret of the run tokens, mode 0600.
	SigningKeyFile = "signing-key"
	databaseFile   = "belay.db"
	artifactsDir   = "artifacts"
	sandboxesDir   = "sandboxes"
	// ociDir holds the OCI launcher's state: runc's (0700: a container's
	// state holds its environment).
	ociDir = "oci"
	// imagesDir holds the OCI launcher's unpacked images.
	imagesDir = "images"
)

// Where `belay serve` keeps its data as root when BELAY_DATA_DIR is not
// set: system locations rather than root's home, which is 0700 and so out
// of the sandbox uids' reach.
const (
	// DefaultRootDataDir holds the database, artifacts and secrets; it
	// stays 0700.
	DefaultRootDataDir = "/var/lib/belay"
	// DefaultRootSandboxDir holds the sandbox workspaces of a data
	// directory at DefaultRootDataDir: root's, 0711, so the sandbox uids
	// reach their own workspace and nothing else, below folders only
	// root can write.
	DefaultRootSandboxDir = localsandbox.DefaultRootWorkRoot
	// DefaultRootImageCache holds the OCI launcher's unpacked images for a
	// data directory at DefaultRootDataDir: a cache (made again from the
	// image when gone), root's, 0711, which each sandbox's user namespace
	// root passes through to mount its image.
	DefaultRootImageCache = "/var/cache/belay/images"
)

// Config is the embedded control plane's configuration: what `belay serve`
// takes from flags and the environment. Model, and the upstream (URL and
// key, or ScriptedModel) are required; the rest have defaults.
type Config struct {
	// Addr is the listen address; DefaultAddr when empty. Port 0 picks a
	// free port (see Main.Addr).
	Addr string
	// DataDir holds the database, artifacts, token files and, by default,
	// the sandbox workspaces (not at DefaultRootDataDir); DefaultDataDir
	// when empty.
	DataDir string
	// Model is the one model runs may use.
	Model string
	// ModelAPIURL is the OpenAI-compatible chat-completions endpoint:
	// https, or plain http to a loopback address. With another
	// Provider.Kind it is that provider's URL (see ProviderConfig).
	ModelAPIURL string
	// Provider chooses the model provider: OpenAI-compatible (the zero
	// value), Anthropic or Bedrock.
	Provider ProviderConfig
	// ModelAPIKey is the provider key, or ModelAPIKeyFile a 0600 file
	// holding it (re-read when the upstream refuses it). Not both.
	ModelAPIKey     string
	ModelAPIKeyFile string
	// Token is the control-plane token. When empty, the token in
	// <DataDir>/control-token is used, created on first start.
	Token string
	// SandboxBin is the process launcher's sandbox entry binary; when
	// empty, belay-sandbox beside the running executable, else on PATH.
	// (The OCI launcher runs the entry in the image.)
	SandboxBin string
	// SandboxDir holds one workspace per running sandbox; when empty,
	// DefaultRootSandboxDir for the data directory DefaultRootDataDir,
	// else <DataDir>/sandboxes. As root, the sandbox users must be able
	// to search every directory above it and write none of them (see
	// localsandbox.Config.WorkRoot).
	SandboxDir string
	// Storage chooses where runs and artifacts are kept; the zero value
	// keeps both in DataDir.
	Storage StorageConfig
	// Limits adds the operator's extensions and checks to the reference
	// run limits.
	Limits belay.OperatorLimits
	// Isolation is passed to the process launcher: "auto" (the default)
	// or "none".
	Isolation string
	// Launcher is LauncherOCI or LauncherProcess; empty picks LauncherOCI
	// when runc, the image and root are there, else the process launcher
	// if AllowWeakIsolation accepts it (see chooseLauncher).
	Launcher string
	// AllowWeakIsolation accepts the process launcher's weaker isolation
	// (WeakIsolation says what it lacks).
	AllowWeakIsolation bool
	// SandboxImage is the OCI launcher's sandbox image (an OCI archive);
	// when empty, SandboxImageName beside the running executable.
	SandboxImage string
	// ImageCache is where the OCI launcher unpacks images, one folder per
	// digest; when empty, DefaultRootImageCache for the data directory
	// DefaultRootDataDir, else <DataDir>/images (and the data directory
	// is then 0711 as root: each sandbox's user namespace root passes
	// through it). Tests share one.
	ImageCache string
	// EventBufferSize is how many events each run keeps; the store's
	// default when zero.
	EventBufferSize int
	// SandboxEventLimits caps what each run's sandbox may append to its
	// log; zero fields take belay.DefaultSandboxEventLimits.
	SandboxEventLimits belay.SandboxEventLimits
	// MaxResumes is how many times a run whose sandbox was lost resumes
	// on a new one, from its latest checkpoint, at most (0 to
	// MaxMaxResumes; 0 turns resumes off, and a restart then fails the
	// runs left running). Nil means belay.DefaultMaxResumes.
	MaxResumes *int
	// ShutdownTimeout bounds Close: in-flight requests, then runs in
	// flight. DefaultShutdownTimeout when zero.
	ShutdownTimeout time.Duration
	// Logger receives the control plane's log lines, each with run_id where
	// a run is concerned and never a token, key, prompt or file content.
	// Nil discards.
	Logger *slog.Logger
	// ScriptedModel is the path of a scripted model session
	// (internal/scriptedmodel). When set, the control plane serves it
	// in-process on a loopback listener and uses it as the upstream, for
	// the offline demo and tests; ModelAPIURL must then be empty, and the
	// key and model are optional.
	ScriptedModel string
	// RepoEvents configures git sources, GitHub's webhooks (with a
	// triggers file) and the safe outputs.
	RepoEvents RepoEventsConfig
	// OnDispatched, when set, is called after each repository event is
	// dispatched (tests wait on it).
	OnDispatched func(belay.RepoEvent, dispatch.Outcome, error)
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Rand is the entropy of the generated token and signing key; nil
	// means crypto/rand.
	Rand io.Reader
}

// ConfigFromEnv reads the BELAY_* variables through lookup (os.LookupEnv in
// `belay serve`). Unset variables leave their fields empty, for New's
// defaults; DataDir gets DefaultDataDir's answer.
func ConfigFromEnv(lookup func(string) (string, bool)) Config {
	get := func(k string) string {
		v, _ := lookup(k)
		return strings.TrimSpace(v)
	}
	return Config{
		Addr:            get(EnvAddr),
		DataDir:         DefaultDataDir(lookup),
		Model:           get(EnvModel),
		ModelAPIURL:     get(EnvModelAPIURL),
		ModelAPIKey:     get(EnvModelAPIKey),
		ModelAPIKeyFile: get(EnvModelKeyFile),
		Token:           get(EnvToken),
		SandboxBin:      get(EnvSandboxBin),
		SandboxDir:      get(EnvSandboxDir),
		ScriptedModel:   get(EnvScriptedModel),
		Storage:         storageConfigFromEnv(get),
		Limits:          belay.ParseOperatorLimits(get(EnvExtensions), get(EnvChecks)),
		Provider:        providerConfigFromEnv(get),
		RepoEvents:      repoEventsConfigFromEnv(get),
		SandboxEventLimits: belay.SandboxEventLimits{
			MaxEvents: int(positiveFromEnv(get(EnvSandboxEvents))),
			MaxBytes:  positiveFromEnv(get(EnvSandboxEventBytes)),
		},
		MaxResumes:         resumesFromEnv(get(EnvMaxResumes)),
		Launcher:           get(EnvLauncher),
		SandboxImage:       get(EnvSandboxImage),
		ImageCache:         get(EnvImageCache),
		AllowWeakIsolation: parseBool(get(EnvAllowWeakIsolation)),
	}
}

// MaxMaxResumes bounds Config.MaxResumes (belay.MaxMaxResumes).
const MaxMaxResumes = belay.MaxMaxResumes

// resumesFromEnv reads BELAY_MAX_RESUMES: nil when unset, -1 when it is
// not a whole number from 0 to MaxMaxResumes, which New then refuses
// naming the variable.
func resumesFromEnv(v string) *int {
	if v == "" {
		return nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > MaxMaxResumes {
		n = -1
	}
	return &n
}

// orchestratorResumes is Config.MaxResumes as orchestrator.Config takes it.
func orchestratorResumes(n *int) int {
	switch {
	case n == nil:
		return 0 // the default
	case *n == 0:
		return -1 // never
	}
	return *n
}

// positiveFromEnv reads a count from the environment: 0 when unset, -1
// when it is not a positive whole number, which New then refuses naming
// the variable.
func positiveFromEnv(v string) int64 {
	if v == "" {
		return 0
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 1 || n > math.MaxInt32 {
		return -1
	}
	return n
}

// DefaultDataDir returns BELAY_DATA_DIR; else, as root,
// DefaultRootDataDir; else $XDG_DATA_HOME/belay, else
// ~/.local/share/belay, or "" when none of HOME and XDG_DATA_HOME is set.
// The server and the CLI both call it, so they agree on where the token is.
func DefaultDataDir(lookup func(string) (string, bool)) string {
	return defaultDataDir(lookup, os.Geteuid())
}

func defaultDataDir(lookup func(string) (string, bool), euid int) string {
	if v, ok := lookup(EnvDataDir); ok && strings.TrimSpace(v) != "" {
		return strings.TrimSpace(v)
	}
	if euid == 0 {
		return DefaultRootDataDir
	}
	if v, ok := lookup("XDG_DATA_HOME"); ok && filepath.IsAbs(v) {
		return filepath.Join(v, "belay")
	}
	if v, ok := lookup("HOME"); ok && v != "" {
		return filepath.Join(v, ".local", "share", "belay")
	}
	return ""
}
