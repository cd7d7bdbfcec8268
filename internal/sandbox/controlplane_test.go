package sandbox_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/httpapi"
	"github.com/belay-dev/belay/internal/localdir"
	"github.com/belay-dev/belay/internal/sandbox"
	"github.com/belay-dev/belay/internal/scriptedmodel"
	"github.com/belay-dev/belay/internal/sqlite"
	"github.com/belay-dev/belay/internal/token"
	"github.com/belay-dev/belay/internal/wire"
)

const testModel = "scripted-model-1"

// providerKeyCanary is the control plane's provider key: it must never
// reach the sandbox, its files or its output.
const providerKeyCanary = "sk-PROVIDER-KEY-CANARY-90b1e2"

// controlPlane is the real control plane's handler (httpapi) over a real
// SQLite store, with a scripted model behind its model proxy, serving its
// internal routes on a Unix socket as the embedded launcher does.
type controlPlane struct {
	store        *sqlite.Store
	arts         *localdir.Store
	signer       *token.Signer
	api          *httpapi.Server
	model        *scriptedmodel.Server
	socket       string
	public       *httptest.Server
	controlToken string
	// logs is the control plane's own log, at debug level: a secret must
	// not reach it either.
	logs *syncBuffer
	// front, when set, sees each internal request before the handler.
	frontMu sync.Mutex
	front   func(w http.ResponseWriter, r *http.Request, next http.Handler)
}

// noopOrchestrator accepts runs; the tests drive the run's states
// themselves, as the orchestrator would.
type noopOrchestrator struct{}

func (noopOrchestrator) Submit(context.Context, string) error { return nil }
func (noopOrchestrator) Cancel(context.Context, string) error { return nil }

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func randomHex(tb testing.TB, n int) string {
	tb.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		tb.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// newControlPlane starts a control plane whose internal socket is in dir.
func newControlPlane(tb testing.TB, dir string, script scriptedmodel.Script, opts ...scriptedmodel.Option) *controlPlane {
	tb.Helper()
	return newControlPlaneWith(tb, dir, script, nil, opts...)
}

// newControlPlaneWith is newControlPlane with a last say on the handler's
// configuration.
func newControlPlaneWith(tb testing.TB, dir string, script scriptedmodel.Script, configure func(*httpapi.Config), opts ...scriptedmodel.Option) *controlPlane {
	tb.Helper()
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(tb.TempDir(), "belay.db"), sqlite.Options{})
	if err != nil {
		tb.Fatalf("open sqlite store: %v", err)
	}
	tb.Cleanup(func() { _ = st.Close() })
	arts, err := localdir.New(filepath.Join(tb.TempDir(), "artifacts"))
	if err != nil {
		tb.Fatal(err)
	}
	signer, err := token.NewSigner([]byte(randomHex(tb, 32)), time.Now)
	if err != nil {
		tb.Fatal(err)
	}
	cp := &controlPlane{store: st, arts: arts, signer: signer, controlToken: randomHex(tb, 16), logs: &syncBuffer{}}
	cp.model = scriptedmodel.New(script, opts...)
	modelSrv := httptest.NewServer(cp.model)
	tb.Cleanup(func() {
		// A model call may still be waiting on a scripted delay after its
		// sandbox is gone; end it rather than wait for it.
		modelSrv.CloseClientConnections()
		modelSrv.Close()
	})

	lim := belay.DefaultLimits(testModel)
	lim.AllowedChecks = append(lim.AllowedChecks, []string{"python3", "-c", "import calc; assert calc.add(2, 3) == 5"})
	cfg := httpapi.Config{
		Store: st, Artifacts: arts, Orchestrator: noopOrchestrator{}, Signer: signer, Limits: lim,
		ControlTokens: []string{cp.controlToken},
		Logger:        slog.New(slog.NewJSONHandler(cp.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Upstream: httpapi.Upstream{
			URL: modelSrv.URL + "/v1/chat/completions", AllowLoopbackHTTP: true,
			Key: func(context.Context) (string, error) { return providerKeyCanary, nil },
		},
	}
	if configure != nil {
		configure(&cfg)
	}
	cp.api, err = httpapi.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	cp.public = httptest.NewServer(cp.api)
	tb.Cleanup(cp.public.Close)

	cp.socket = filepath.Join(dir, "api.sock")
	ln, err := net.Listen("unix", cp.socket)
	if err != nil {
		tb.Fatal(err)
	}
	internal := cp.api.InternalHandler()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cp.frontMu.Lock()
		front := cp.front
		cp.frontMu.Unlock()
		if front != nil {
			front(w, r, internal)
			return
		}
		internal.ServeHTTP(w, r)
	}), ErrorLog: nil}
	go func() { _ = srv.Serve(ln) }()
	tb.Cleanup(func() { _ = srv.Close() })
	return cp
}

// apiClient is the entry's client for the control plane's socket, checking
// that its listener is this test process.
func (cp *controlPlane) apiClient(tb testing.TB) *http.Client {
	tb.Helper()
	c, err := sandbox.NewAPIClient(cp.socket, &sandbox.APIPeer{UID: os.Geteuid(), SharesUID: true})
	if err != nil {
		tb.Fatalf("NewAPIClient: %v", err)
	}
	return c
}

// staged returns the outputs the entry uploaded for the run's attempt, as
// the orchestrator reads them from the artifact store.
func (cp *controlPlane) staged(tb testing.TB, runID string) map[string][]byte {
	tb.Helper()
	run, err := cp.store.GetRun(context.Background(), runID)
	if err != nil {
		tb.Fatal(err)
	}
	files := map[string][]byte{}
	for _, name := range belay.ArtifactNames {
		b, err := cp.arts.GetArtifact(context.Background(), runID, belay.StagedOutputName(run.Attempt, name))
		if belay.IsCode(err, belay.CodeNotFound) {
			continue
		}
		if err != nil {
			tb.Fatalf("staged %s: %v", name, err)
		}
		files[name] = b
	}
	return files
}

func (cp *controlPlane) setFront(f func(w http.ResponseWriter, r *http.Request, next http.Handler)) {
	cp.frontMu.Lock()
	defer cp.frontMu.Unlock()
	cp.front = f
}

// startRun creates a run through the public API and takes it where the
// orchestrator would before launching a sandbox: running, with an active
// capability and a set of tokens.
func (cp *controlPlane) startRun(tb testing.TB, req map[string]any) (string, token.Set) {
	tb.Helper()
	ctx := context.Background()
	var created wire.CreateRunResponse
	cp.publicCall(tb, http.MethodPost, "/v1/runs", req, http.StatusAccepted, &created)
	run, err := cp.store.GetRun(ctx, created.RunID)
	if err != nil {
		tb.Fatal(err)
	}
	now := time.Now()
	if _, err := cp.store.Transition(ctx, run.ID, belay.Transition{To: belay.StatusRunning, At: now, Attempt: 1,
		Events: []belay.EventInput{{Time: now, Type: belay.EventRunStarted}}}); err != nil {
		tb.Fatal(err)
	}
	if err := cp.store.ActivateCapability(ctx, belay.Capability{RunID: run.ID, Model: run.Request.Model,
		State: belay.CapabilityActive, ExpiresAt: now.Add(10 * time.Minute), MaxRequests: run.Request.MaxRequests()}); err != nil {
		tb.Fatal(err)
	}
	set, err := cp.signer.IssueSet(run.ID, run.Request.Model, 10*time.Minute)
	if err != nil {
		tb.Fatal(err)
	}
	return run.ID, set
}

// publicCall calls the public API as the control-plane client does.
func (cp *controlPlane) publicCall(tb testing.TB, method, path string, body any, wantStatus int, out any) {
	tb.Helper()
	if err := cp.publicDo(method, path, body, wantStatus, out); err != nil {
		tb.Fatal(err)
	}
}

// publicDo is publicCall for a goroutine other than the test's, which may
// not call Fatal: it returns what went wrong.
func (cp *controlPlane) publicDo(method, path string, body any, wantStatus int, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, cp.public.URL+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+cp.controlToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != wantStatus {
		return fmt.Errorf("%s %s: status %d, want %d: %s", method, path, resp.StatusCode, wantStatus, data)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("%s %s: %w", method, path, err)
		}
	}
	return nil
}

// events returns the run's whole log.
func (cp *controlPlane) events(tb testing.TB, runID string) []belay.Event {
	tb.Helper()
	page, err := cp.store.ListEvents(context.Background(), runID, 0, 10000)
	if err != nil {
		tb.Fatal(err)
	}
	return page.Events
}

// runRequest is a run request for the test files.
func runRequest(policy belay.ApprovalPolicy, timeoutSeconds int) map[string]any {
	files := make([]map[string]string, len(testFiles))
	for i, f := range testFiles {
		files[i] = map[string]string{"path": f.Path, "content": f.Content}
	}
	approval := map[string]any{"policy": string(policy)}
	if timeoutSeconds > 0 {
		approval["timeoutSeconds"] = timeoutSeconds
	}
	return map[string]any{
		"instruction":     "Fix add in calc.py so the test passes.",
		"files":           files,
		"allowedPaths":    testAllowed,
		"checks":          [][]string{{"git", "diff", "--check"}, {"python3", "-c", "import calc; assert calc.add(2, 3) == 5"}},
		"maxSteps":        6,
		"wallTimeSeconds": 60,
		"approval":        approval,
	}
}
