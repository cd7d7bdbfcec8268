package sandbox_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/hardening"
	"github.com/belay-dev/belay/internal/httpapi"
	belays3 "github.com/belay-dev/belay/internal/s3"
	"github.com/belay-dev/belay/internal/sandbox"
	wsnames "github.com/belay-dev/belay/internal/sandbox/workspace"
)

func init() {
	helpers["claim-entry"] = func() int {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
		defer stop()
		arn := os.Getenv("BELAY_TEST_TASK_ARN")
		return sandbox.MainClaim(ctx, os.Getenv, func(context.Context) string { return arn })
	}
}

// issueClaim stores a claim for the run's attempt 1, as the orchestrator's
// activation does, and returns its code.
func issueClaim(t *testing.T, cp *controlPlane, runID string) string {
	t.Helper()
	code, c, err := belay.NewClaim(runID, 1, time.Now(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if err := cp.store.CreateClaim(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	return code.Reveal()
}

// claimWorkspace is a fresh directory the entry (testUID, as root) may
// build its workspace in.
func claimWorkspace(t *testing.T) string {
	t.Helper()
	ws := filepath.Join(worldReadableDir(t), "workspace")
	mustDo(t, os.Mkdir(ws, 0o700))
	if isRoot() {
		mustDo(t, os.Chown(ws, testUID, testUID))
	}
	return ws
}

// claimEnv is the claim-mode environment for cp's socket.
func claimEnv(cp *controlPlane, code, ws string) []string {
	return []string{
		wsnames.EnvClaim + "=" + code,
		wsnames.EnvAPIURL + "=http://belay",
		wsnames.EnvAPISocket + "=" + cp.socket,
		wsnames.EnvAPIPeerUID + "=" + strconv.Itoa(os.Geteuid()),
		wsnames.EnvWorkspace + "=" + ws,
		"BELAY_TEST_SECRET=" + envCanary,
	}
}

// runClaimEntry runs the entry in claim mode with env and waits for it.
func runClaimEntry(t *testing.T, bin string, env []string) (code int, stdout, stderr string) {
	t.Helper()
	cmd := helperCommand(t, bin, "claim-entry", env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), out.String(), errb.String()
	} else if err != nil {
		t.Fatal(err)
	}
	return 0, out.String(), errb.String()
}

// TestEntryClaimModeRunsOnceFromTheCode: an entry with nothing but a claim
// code claims its run, runs the agent as in file mode and uploads its
// bundle; a second entry with the same code is refused before it learns
// anything about the run, and neither the code nor a token is in any
// output.
func TestEntryClaimModeRunsOnceFromTheCode(t *testing.T) {
	dir := worldReadableDir(t)
	cp := newControlPlane(t, dir, fixScript())
	if isRoot() {
		mustDo(t, os.Chown(cp.socket, testUID, testUID))
	}
	runID, _ := cp.startRun(t, runRequest(belay.PolicyDenyAll, 0))
	code := issueClaim(t, cp, runID)
	bin := helperBinary(t)
	ws := claimWorkspace(t)
	const arn = "arn:aws:ecs:eu-west-1:123456789012:task/belay/feedc0de"

	exit, stdout, stderr := runClaimEntry(t, bin, append(claimEnv(cp, code, ws), "BELAY_TEST_TASK_ARN="+arn))
	if exit != 0 {
		t.Fatalf("entry exited %d\nstderr:\n%s", exit, stderr)
	}
	run, err := cp.store.GetRun(context.Background(), runID)
	if err != nil {
		t.Fatal(err)
	}
	bundle, err := belay.ValidateResult(runID, run.Request, cp.staged(t, runID))
	if err != nil {
		t.Fatalf("the control plane would refuse the uploaded bundle: %v", err)
	}
	if bundle.Status != belay.StatusCompleted || !strings.Contains(bundle.Summary, "Fixed add") {
		t.Errorf("bundle = %s %q, want completed with the agent's summary", bundle.Status, bundle.Summary)
	}
	if run.SandboxRef != arn {
		t.Errorf("run's sandbox = %q, want the task ARN the entry claimed with", run.SandboxRef)
	}
	if _, err := os.Stat(filepath.Join(ws, "repo", ".git")); err != nil {
		t.Errorf("no repository in BELAY_WORKSPACE: %v", err)
	}
	if !strings.Contains(stderr, `"msg":"claimed the run","run_id":"`+runID+`","attempt":1`) {
		t.Errorf("the entry does not log the run it claimed:\n%s", stderr)
	}

	// The same code again: refused, nothing run, no model call.
	calls := cp.model.Calls()
	exit2, stdout2, stderr2 := runClaimEntry(t, bin, claimEnv(cp, code, claimWorkspace(t)))
	if exit2 == 0 || !strings.Contains(stderr2, "claim refused: the code is unknown, used or expired") {
		t.Fatalf("second entry with the same code exited %d:\n%s", exit2, stderr2)
	}
	if cp.model.Calls() != calls {
		t.Error("the refused entry called the model")
	}
	if !strings.Contains(cp.logs.String(), `"reason":"used"`) {
		t.Error("the control plane's log does not say the code was used")
	}

	for where, text := range map[string]string{"stdout": stdout + stdout2, "stderr": stderr + stderr2, "the control plane's log": cp.logs.String()} {
		if strings.Contains(text, code) {
			t.Errorf("the claim code appears in %s", where)
		}
		if strings.Contains(text, "bt1.") {
			t.Errorf("a run token appears in %s", where)
		}
		if strings.Contains(text, envCanary) || strings.Contains(text, providerKeyCanary) {
			t.Errorf("a canary appears in %s", where)
		}
	}
	for _, e := range cp.events(t, runID) {
		if bytes.Contains(e.Data, []byte("bt1.")) || bytes.Contains(e.Data, []byte(code)) {
			t.Errorf("event %d (%s) holds a token or the code", e.Seq, e.Type)
		}
	}
	for name, b := range cp.staged(t, runID) {
		if bytes.Contains(b, []byte("bt1.")) || bytes.Contains(b, []byte(code)) {
			t.Errorf("uploaded %s holds a token or the code", name)
		}
	}
}

// TestEntryClaimModeUploadsToPresignedURLs: when the claim answer's targets
// are presigned S3 PUTs (AWS), the entry uploads there, with no credential
// of its own, and not through the control plane.
func TestEntryClaimModeUploadsToPresignedURLs(t *testing.T) {
	faker := gofakes3.New(s3mem.New())
	srv := httptest.NewServer(faker.Server())
	t.Cleanup(srv.Close)
	client := belays3.NewLocalClient(srv.URL)
	if _, err := client.CreateBucket(context.Background(), &awss3.CreateBucketInput{Bucket: aws.String("belay-artifacts")}); err != nil {
		t.Fatal(err)
	}
	s3store := belays3.New(client, "belay-artifacts", "")
	dir := worldReadableDir(t)
	cp := newControlPlaneWith(t, dir, fixScript(), func(c *httpapi.Config) { c.Presigner = s3store })
	if isRoot() {
		mustDo(t, os.Chown(cp.socket, testUID, testUID))
	}
	runID, _ := cp.startRun(t, runRequest(belay.PolicyDenyAll, 0))
	exit, _, stderr := runClaimEntry(t, helperBinary(t), claimEnv(cp, issueClaim(t, cp, runID), claimWorkspace(t)))
	if exit != 0 {
		t.Fatalf("entry exited %d\nstderr:\n%s", exit, stderr)
	}
	files := map[string][]byte{}
	for _, name := range belay.ArtifactNames {
		b, err := s3store.GetArtifact(context.Background(), runID, belay.StagedOutputName(1, name))
		if err != nil {
			t.Fatalf("staged %s on S3: %v", name, err)
		}
		files[name] = b
	}
	run, _ := cp.store.GetRun(context.Background(), runID)
	if b, err := belay.ValidateResult(runID, run.Request, files); err != nil || b.Status != belay.StatusCompleted {
		t.Fatalf("bundle on S3: %+v, %v", b.Status, err)
	}
	if local := cp.staged(t, runID); len(local) != 0 {
		t.Errorf("outputs went through the control plane too: %d files", len(local))
	}
}

// TestEntryClaimModeRefusesABadEnvironment: each missing or wrong setting
// stops the entry before it sends anything, with a line naming the
// variable and never the code.
func TestEntryClaimModeRefusesABadEnvironment(t *testing.T) {
	dir := worldReadableDir(t)
	cp := newControlPlane(t, dir, fixScript())
	if isRoot() {
		mustDo(t, os.Chown(cp.socket, testUID, testUID))
	}
	runID, _ := cp.startRun(t, runRequest(belay.PolicyDenyAll, 0))
	code := issueClaim(t, cp, runID)
	bin := helperBinary(t)
	ws := claimWorkspace(t)
	without := func(name string) []string {
		var env []string
		for _, kv := range claimEnv(cp, code, ws) {
			if !strings.HasPrefix(kv, name+"=") {
				env = append(env, kv)
			}
		}
		return env
	}
	tests := []struct {
		name string
		env  []string
		want string
	}{
		{"no_claim", without(wsnames.EnvClaim), wsnames.EnvClaim + " is not set"},
		{"no_url", without(wsnames.EnvAPIURL), wsnames.EnvAPIURL},
		{"remote_http", append(without(wsnames.EnvAPISocket), wsnames.EnvAPIURL+"=http://api.example.com"), "plain http to a remote host"},
		{"socket_without_peer", without(wsnames.EnvAPIPeerUID), wsnames.EnvAPIPeerUID},
		{"bad_peer", append(without(wsnames.EnvAPIPeerUID), wsnames.EnvAPIPeerUID+"=root"), "is not a uid"},
		{"relative_workspace", append(without(wsnames.EnvWorkspace), wsnames.EnvWorkspace+"=work"), "not an absolute path"},
		{"wrong_peer", append(without(wsnames.EnvAPIPeerUID), wsnames.EnvAPIPeerUID+"=4242"), "not the control plane's uid 4242"},
	}
	for _, tt := range tests {
		exit, _, stderr := runClaimEntry(t, bin, tt.env)
		if exit == 0 || !strings.Contains(stderr, tt.want) {
			t.Errorf("%s: exited %d, stderr %q; want a failure saying %q", tt.name, exit, stderr, tt.want)
		}
		if strings.Contains(stderr, code) {
			t.Errorf("%s: stderr holds the claim code", tt.name)
		}
	}
	if n := cp.model.Calls(); n != 0 {
		t.Errorf("the model was called %d times", n)
	}
	// None of them spent the code.
	if exit, _, stderr := runClaimEntry(t, bin, claimEnv(cp, code, ws)); exit != 0 {
		t.Fatalf("the entry with a good environment exited %d:\n%s", exit, stderr)
	}
}

func TestClaimWorkspaceDefaultIsTheImagesWorkspace(t *testing.T) {
	if wsnames.DefaultClaimWorkspace != hardening.Sandbox.WorkspaceDir {
		t.Fatalf("claim mode's default workspace %q is not the image's %q", wsnames.DefaultClaimWorkspace, hardening.Sandbox.WorkspaceDir)
	}
}
