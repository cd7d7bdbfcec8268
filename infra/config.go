package main

import (
	"fmt"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"

	"github.com/aws/constructs-go/constructs/v10"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/hardening"
	"github.com/belay-dev/belay/internal/triggers"
)

// The context values the stack reads (`cdk synth -c name=value`, or the
// "context" of cdk.json). The README's deploy guide lists them.
const (
	ctxAZCount            = "azCount"
	ctxAuth               = "auth"
	ctxSandboxImageDigest = "sandboxImageDigest"
	ctxSandboxArch        = "sandboxArch"
	ctxSandboxCPU         = "sandboxCpu"
	ctxSandboxMemoryMiB   = "sandboxMemoryMiB"
	ctxFunctionsDir       = "functionsDir"
	ctxModel              = "model"
	ctxModelAPIURL        = "modelApiUrl"
	ctxModelProvider      = "modelProvider"
	ctxArtifactExpiryDays = "artifactExpiryDays"
	ctxLogRetentionDays   = "logRetentionDays"
	ctxThrottleRate       = "throttleRateLimit"
	ctxThrottleBurst      = "throttleBurstLimit"
	ctxAlarmEmail         = "alarmEmail"
	ctxTriggers           = "triggers"
	ctxExtensions         = "extensions"
	ctxChecks             = "checks"
)

// Who may call the public API.
const (
	// authToken: anyone holding the control-plane token, as embedded; the
	// api and stream functions compare it in constant time.
	authToken = "token"
	// authSigV4: API Gateway verifies the caller's AWS signature (IAM); the
	// functions hold no token and accept only a request whose request
	// context names the IAM identity API Gateway authenticated.
	authSigV4 = "sigv4"
)

// config is the stack's configuration, read once from the context and
// checked, so a mistake fails synthesis with a message naming the value.
type config struct {
	AZCount int
	Auth    string
	// ImageDigest pins the sandbox image ("sha256:<64 hex>"); empty means
	// the template takes it as the SandboxImageDigest parameter.
	ImageDigest string
	// ARM64 is the sandbox task's CPU architecture: ARM64 (Graviton), or
	// X86_64 when the image was built for amd64.
	ARM64 bool
	// SandboxCPU and SandboxMemoryMiB are the Fargate task's size.
	SandboxCPU, SandboxMemoryMiB int
	// FunctionsDir holds <name>/bootstrap for each function.
	FunctionsDir       string
	Model              string
	ModelAPIURL        string
	ModelProvider      string
	ArtifactExpiryDays int
	LogRetentionDays   int
	ThrottleRate       int
	ThrottleBurst      int
	AlarmEmail         string
	// Triggers is the triggers file's JSON for the webhook and the
	// dispatcher (context "triggers": the JSON, or @path of a file);
	// empty deploys them without triggers (they refuse to start).
	Triggers string
	// Extensions and Checks are the operator's additions to the run
	// limits, written as for belay serve (belay.ParseOperatorLimits);
	// every function gets them as BELAY_EXTENSIONS and BELAY_CHECKS.
	Extensions, Checks string
}

var digestPattern = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// readConfig reads and checks the context of scope (the app).
func readConfig(scope constructs.Construct) (config, error) {
	node := scope.Node()
	str := func(name, def string) string {
		v := node.TryGetContext(&name)
		if v == nil {
			return def
		}
		return strings.TrimSpace(fmt.Sprint(v))
	}
	var errs []string
	num := func(name string, def, lo, hi int) int {
		s := str(name, strconv.Itoa(def))
		// -c name=2 arrives as a string, cdk.json's 2 as a float64.
		f, err := strconv.ParseFloat(s, 64)
		n := int(f)
		if err != nil || float64(n) != f || n < lo || n > hi {
			errs = append(errs, fmt.Sprintf("context %s=%q: want a whole number from %d to %d", name, s, lo, hi))
			return def
		}
		return n
	}
	c := config{
		AZCount:            num(ctxAZCount, 2, 1, 2),
		Auth:               str(ctxAuth, authToken),
		ImageDigest:        str(ctxSandboxImageDigest, ""),
		SandboxCPU:         num(ctxSandboxCPU, hardening.Sandbox.CPUUnits, 256, 16384),
		SandboxMemoryMiB:   num(ctxSandboxMemoryMiB, hardening.Sandbox.MemoryMiB, 512, 122880),
		FunctionsDir:       str(ctxFunctionsDir, "bin/functions"),
		Model:              str(ctxModel, ""),
		ModelAPIURL:        str(ctxModelAPIURL, ""),
		ModelProvider:      str(ctxModelProvider, "openai"),
		ArtifactExpiryDays: num(ctxArtifactExpiryDays, 30, 1, 3650),
		LogRetentionDays:   num(ctxLogRetentionDays, 30, 1, 3653),
		ThrottleRate:       num(ctxThrottleRate, 20, 1, 10000),
		ThrottleBurst:      num(ctxThrottleBurst, 40, 1, 5000),
		AlarmEmail:         str(ctxAlarmEmail, ""),
		Triggers:           str(ctxTriggers, ""),
		Extensions:         str(ctxExtensions, ""),
		Checks:             str(ctxChecks, ""),
	}
	switch c.Auth {
	case authToken, authSigV4:
	default:
		errs = append(errs, fmt.Sprintf("context %s=%q: want %q (the control-plane token) or %q (AWS IAM signatures)", ctxAuth, c.Auth, authToken, authSigV4))
	}
	switch arch := str(ctxSandboxArch, "arm64"); arch {
	case "arm64":
		c.ARM64 = true
	case "amd64":
	default:
		errs = append(errs, fmt.Sprintf("context %s=%q: want arm64 or amd64, the architecture the sandbox image was built for", ctxSandboxArch, arch))
	}
	if c.ImageDigest != "" && !digestPattern.MatchString(c.ImageDigest) {
		errs = append(errs, fmt.Sprintf("context %s=%q: want sha256: and 64 lowercase hex digits (scripts/deploy.sh sets it from the pushed image)", ctxSandboxImageDigest, c.ImageDigest))
	}
	if err := fargateSize(c.SandboxCPU, c.SandboxMemoryMiB); err != nil {
		errs = append(errs, err.Error())
	}
	if c.Model == "" {
		errs = append(errs, fmt.Sprintf("context %s is empty: name the one model runs may use (cdk.json or -c %s=NAME)", ctxModel, ctxModel))
	}
	if err := checkModelURL(c.ModelAPIURL); err != nil {
		errs = append(errs, err.Error())
	}
	if c.ThrottleBurst < c.ThrottleRate/10 {
		errs = append(errs, fmt.Sprintf("context %s=%d is far below %s=%d: a burst smaller than a tenth of the rate refuses most requests", ctxThrottleBurst, c.ThrottleBurst, ctxThrottleRate, c.ThrottleRate))
	}
	if c.AlarmEmail != "" && !strings.Contains(c.AlarmEmail, "@") {
		errs = append(errs, fmt.Sprintf("context %s=%q is not an email address", ctxAlarmEmail, c.AlarmEmail))
	}
	if path, ok := strings.CutPrefix(c.Triggers, "@"); ok {
		b, err := os.ReadFile(path)
		if err != nil {
			errs = append(errs, fmt.Sprintf("context %s: %v", ctxTriggers, err))
		}
		c.Triggers = string(b)
	}
	lim, err := belay.ParseOperatorLimits(c.Extensions, c.Checks).
		Apply(belay.DefaultLimits(c.Model), "context "+ctxExtensions, "context "+ctxChecks)
	if err != nil {
		errs = append(errs, err.Error())
	}
	if c.Triggers != "" && c.Model != "" && err == nil {
		lim.GitURLs = triggers.OperatorGitURLs
		if _, err := triggers.Parse(strings.NewReader(c.Triggers), lim); err != nil {
			errs = append(errs, fmt.Sprintf("context %s: %v", ctxTriggers, err))
		}
	}
	if len(errs) > 0 {
		return c, fmt.Errorf("belay stack configuration:\n  %s", strings.Join(errs, "\n  "))
	}
	return c, nil
}

// checkModelURL applies the model proxy's own rule for the upstream (HTTPS,
// no query or fragment, a path ending /chat/completions) at synthesis, so a
// typo fails here and not on the first run.
func checkModelURL(s string) error {
	u, err := url.Parse(s)
	switch {
	case s == "":
		return fmt.Errorf("context %s is empty: the provider's OpenAI-compatible URL, like https://api.openai.com/v1/chat/completions", ctxModelAPIURL)
	case err != nil, u.Scheme != "https", u.Host == "":
		return fmt.Errorf("context %s=%q: want an https URL", ctxModelAPIURL, s)
	case u.RawQuery != "" || u.Fragment != "" || u.User != nil:
		return fmt.Errorf("context %s=%q: no query, fragment or credentials (the key lives in Secrets Manager)", ctxModelAPIURL, s)
	case !strings.HasSuffix(u.Path, "/chat/completions"):
		return fmt.Errorf("context %s=%q: the path must end in /chat/completions", ctxModelAPIURL, s)
	}
	return nil
}

// fargateSize checks cpu (in 1/1024 vCPU) and memory against Fargate's
// allowed combinations, which a deploy would otherwise refuse minutes in.
func fargateSize(cpu, mem int) error {
	type band struct{ lo, hi, step int }
	bands := map[int]band{
		256:   {512, 2048, 512}, // 512, 1024, 2048 (checked below)
		512:   {1024, 4096, 1024},
		1024:  {2048, 8192, 1024},
		2048:  {4096, 16384, 1024},
		4096:  {8192, 30720, 1024},
		8192:  {16384, 61440, 4096},
		16384: {32768, 122880, 8192},
	}
	b, ok := bands[cpu]
	if !ok {
		return fmt.Errorf("context %s=%d: Fargate takes 256, 512, 1024, 2048, 4096, 8192 or 16384", ctxSandboxCPU, cpu)
	}
	fits := mem >= b.lo && mem <= b.hi && (mem-b.lo)%b.step == 0
	if cpu == 256 {
		fits = mem == 512 || mem == 1024 || mem == 2048
	}
	if !fits {
		return fmt.Errorf("context %s=%d does not fit %s=%d: Fargate allows %d to %d MiB in steps of %d for that CPU", ctxSandboxMemoryMiB, mem, ctxSandboxCPU, cpu, b.lo, b.hi, b.step)
	}
	return nil
}
