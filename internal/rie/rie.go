// Package rie runs belay's Lambda bootstraps under the AWS Lambda Runtime
// Interface Emulator (the Go module pinned as a tool in go.mod), for tests:
// it builds the emulator and every functions/<name> bootstrap once per test
// binary, for this machine's architecture with the Lambda build tags,
// starts an emulator per function on a loopback port, and invokes it one
// event at a time (the emulator crashes on concurrent invokes).
//
// The emulator answers a handler error with HTTP 200 and an error body, so
// Invoke returns the body for the caller to check, and Result decodes a
// success or reports the error. The emulator buffers a response that the
// runtime streams (it reads the whole body before answering), so a
// streaming function's answer arrives whole, in the response-streaming
// format: a JSON prelude, eight NUL bytes, the body.
package rie

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// emulatorPkg is the emulator's main package (a tool in go.mod).
const emulatorPkg = "github.com/aws/aws-lambda-runtime-interface-emulator/cmd/aws-lambda-rie"

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
)

// Main runs the tests of a package that uses this one and removes the
// binaries it built: call it from TestMain, os.Exit(rie.Main(m)).
func Main(m *testing.M) int {
	code := m.Run()
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
	return code
}

// build compiles the emulator and every function once, in one go build.
func build() (string, error) {
	buildOnce.Do(func() {
		root, err := moduleRoot()
		if err != nil {
			buildErr = err
			return
		}
		dir, err := os.MkdirTemp("", "belay-rie-")
		if err != nil {
			buildErr = err
			return
		}
		buildDir = dir
		// The sandbox entry too, for tests that run a whole run against
		// the functions.
		cmd := exec.Command("go", "build", "-tags", "lambda.norpc", "-trimpath", "-o", dir+string(filepath.Separator),
			"./functions/...", "./sandbox-task", emulatorPkg)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("build the functions and the emulator: %v\n%s", err, out)
		}
	})
	return buildDir, buildErr
}

func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("not inside the belay module")
	}
	return filepath.Dir(mod), nil
}

// Bootstrap returns the path of the named function's bootstrap (or of
// "sandbox-task", the sandbox entry), building all of them (once) if
// needed.
func Bootstrap(tb testing.TB, function string) string {
	tb.Helper()
	dir, err := build()
	if err != nil {
		tb.Fatal(err)
	}
	path := filepath.Join(dir, function)
	if _, err := os.Stat(path); err != nil {
		tb.Fatalf("no bootstrap for function %q: %v", function, err)
	}
	return path
}

// Function is one bootstrap running under its own emulator.
type Function struct {
	Name string
	url  string
	cmd  *exec.Cmd
	logs *lockedBuffer
	mu   sync.Mutex // one invocation at a time
	done chan struct{}
}

// Start starts the named function's bootstrap under an emulator with
// exactly env as its environment (plus PATH), and stops it when the test
// ends.
func Start(tb testing.TB, function string, env map[string]string) *Function {
	tb.Helper()
	bootstrap := Bootstrap(tb, function)
	emulator := filepath.Join(buildDir, "aws-lambda-rie")
	addr := freeAddr(tb)
	// The runtime API gets a port of its own too: the emulator's default
	// (9001) would collide with any other emulator on the machine.
	runtimeAddr := freeAddr(tb)
	f := &Function{Name: function, url: "http://" + addr + "/2015-03-31/functions/function/invocations",
		logs: &lockedBuffer{}, done: make(chan struct{})}
	cmd := exec.Command(emulator, "--runtime-interface-emulator-address", addr, "--runtime-api-address", runtimeAddr, bootstrap)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "AWS_LAMBDA_FUNCTION_NAME=" + function}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stdout, cmd.Stderr = f.logs, f.logs
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start the emulator for %s: %v", function, err)
	}
	f.cmd = cmd
	go func() { _ = cmd.Wait(); close(f.done) }()
	tb.Cleanup(func() {
		f.Stop()
		if tb.Failed() {
			tb.Logf("%s's emulator log:\n%s", function, f.Logs())
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			conn.Close()
			return f
		}
		select {
		case <-f.done:
			tb.Fatalf("the emulator for %s exited at start:\n%s", function, f.Logs())
		default:
		}
		if time.Now().After(deadline) {
			tb.Fatalf("the emulator for %s did not listen on %s within 10 s:\n%s", function, addr, f.Logs())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop kills the emulator and its function, and waits for them.
func (f *Function) Stop() {
	_ = f.cmd.Process.Kill()
	<-f.done
}

// freeAddr returns a loopback address with a port free a moment ago.
func freeAddr(tb testing.TB) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// Invoke sends one event and returns the emulator's status and body. The
// first invocation also initializes the function. A failed call fails the
// test.
func (f *Function) Invoke(tb testing.TB, event []byte) (int, []byte) {
	tb.Helper()
	status, body, err := f.Call(context.Background(), event)
	if err != nil {
		tb.Fatalf("%v\n%s", err, f.Logs())
	}
	return status, body
}

// Call is Invoke for a goroutine other than the test's: it reports a
// failed call as an error.
func (f *Function) Call(ctx context.Context, event []byte) (int, []byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.url, bytes.NewReader(event))
	if err != nil {
		return 0, nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("invoke %s: %w", f.Name, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil, fmt.Errorf("read %s's answer: %w", f.Name, err)
	}
	return resp.StatusCode, body, nil
}

// InvokeError is a handler error as the runtime reports it.
type InvokeError struct {
	Message string `json:"errorMessage"`
	Type    string `json:"errorType"`
}

// Result invokes f with event and decodes a successful answer into out. A
// handler error (which the emulator answers with 200) fails the test.
func (f *Function) Result(tb testing.TB, event []byte, out any) {
	tb.Helper()
	status, body := f.Invoke(tb, event)
	if err, ok := HandlerError(body); ok {
		tb.Fatalf("%s answered a handler error: %s (%s)", f.Name, err.Message, err.Type)
	}
	if status != http.StatusOK {
		tb.Fatalf("%s: emulator status %d: %s", f.Name, status, body)
	}
	if out != nil {
		if err := json.Unmarshal(body, out); err != nil {
			tb.Fatalf("%s's answer %s: %v", f.Name, body, err)
		}
	}
}

// HandlerError reports whether body is the runtime's error object.
func HandlerError(body []byte) (InvokeError, bool) {
	var e InvokeError
	if json.Unmarshal(body, &e) != nil || e.Type == "" && e.Message == "" {
		return InvokeError{}, false
	}
	var rest map[string]json.RawMessage
	_ = json.Unmarshal(body, &rest)
	// An error object has errorMessage/errorType and nothing like a
	// response's statusCode.
	if _, ok := rest["statusCode"]; ok {
		return InvokeError{}, false
	}
	return e, true
}

// WaitLogs polls the log until ok accepts it, for at most 10 s, and
// returns whether it did. The emulator copies the function's output to its
// own asynchronously, so a line the function wrote before answering may
// arrive just after the answer.
func (f *Function) WaitLogs(ok func(logs string) bool) bool {
	deadline := time.Now().Add(10 * time.Second)
	for {
		if ok(f.Logs()) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Logs returns everything the emulator and the function wrote.
func (f *Function) Logs() string { return f.logs.String() }

var initDuration = regexp.MustCompile(`INIT REPORT\(durationMs: ([0-9.]+)\)`)

// InitDuration returns the init phase's duration the emulator reported
// ("INIT REPORT"): from starting the bootstrap until its runtime asked for
// the first event, which covers the process's start and the function's
// own set-up. The emulator copies its log asynchronously, so the line is
// waited for (WaitLogs) after the first invoke has answered.
func (f *Function) InitDuration() (time.Duration, bool) {
	f.WaitLogs(func(logs string) bool { return initDuration.MatchString(logs) })
	m := initDuration.FindStringSubmatch(f.Logs())
	if m == nil {
		return 0, false
	}
	ms, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		return 0, false
	}
	return time.Duration(ms * float64(time.Millisecond)), true
}

var billed = regexp.MustCompile(`Billed Duration: ([0-9]+) ms`)

// BilledDuration returns the sum of the billed durations the emulator
// reported for the function's invocations so far.
func (f *Function) BilledDuration() time.Duration {
	var total time.Duration
	for _, m := range billed.FindAllStringSubmatch(f.Logs(), -1) {
		if ms, err := strconv.Atoi(m[1]); err == nil {
			total += time.Duration(ms) * time.Millisecond
		}
	}
	return total
}

// JSONLines returns the function's log lines that are JSON objects (its
// slog lines and metrics), decoded.
func (f *Function) JSONLines() []map[string]any {
	var lines []map[string]any
	for line := range strings.SplitSeq(f.Logs(), "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "{") {
			continue
		}
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil {
			lines = append(lines, m)
		}
	}
	return lines
}

// StreamedResponse splits an answer in API Gateway's response-streaming
// format into its prelude (status, headers) and body.
type StreamedResponse struct {
	StatusCode        int                 `json:"statusCode"`
	Headers           map[string]string   `json:"headers"`
	MultiValueHeaders map[string][]string `json:"multiValueHeaders"`
	Body              []byte              `json:"-"`
}

// Header returns a header of the prelude.
func (r StreamedResponse) Header(name string) string {
	if v := http.Header(r.MultiValueHeaders).Get(name); v != "" {
		return v
	}
	for k, v := range r.Headers {
		if strings.EqualFold(k, name) {
			return v
		}
	}
	return ""
}

// ParseStreamed parses a streamed answer: JSON prelude, eight NUL bytes,
// body.
func ParseStreamed(b []byte) (StreamedResponse, error) {
	sep := bytes.Index(b, make([]byte, 8))
	if sep < 0 {
		return StreamedResponse{}, errors.New("no prelude delimiter (eight NUL bytes) in the answer")
	}
	var r StreamedResponse
	if err := json.Unmarshal(b[:sep], &r); err != nil {
		return StreamedResponse{}, fmt.Errorf("prelude %q: %w", b[:sep], err)
	}
	r.Body = b[sep+8:]
	return r, nil
}

type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
