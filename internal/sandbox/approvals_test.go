package sandbox_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/sandbox"
	"github.com/belay-dev/belay/internal/scriptedmodel"
	"github.com/belay-dev/belay/internal/wire"
)

// scriptedModelScript is a short session that fixes calc.py.
func scriptedModelScript() scriptedmodel.Script {
	return scriptedmodel.Script{Name: "fix-calc", Steps: []scriptedmodel.Step{
		{ToolCalls: []scriptedmodel.ToolCall{{Name: "read_file", Arguments: []byte(`{"path":"calc.py"}`)}}},
		{ToolCalls: []scriptedmodel.ToolCall{{Name: "edit_file", Arguments: []byte(`{"path":"calc.py","old":"a - b","new":"a + b"}`)}}},
		{ToolCalls: []scriptedmodel.ToolCall{{Name: "finish", Arguments: []byte(`{"summary":"Fixed add."}`)}}},
	}}
}

func newApprovalClient(tb testing.TB, cp *controlPlane, runID, tok string, timeout time.Duration, logs io.Writer) *sandbox.ApprovalClient {
	tb.Helper()
	return sandbox.NewApprovalClient(sandbox.ApprovalsConfig{
		BaseURL: "http://belay", HTTPClient: cp.apiClient(tb), RunID: runID, Token: tok,
		Timeout: timeout, Grace: 2 * time.Second, PollInterval: 20 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(logs, nil)),
	})
}

// decideWhenAsked decides the run's pending approvals through the public
// API, as a person would, as the sandbox asks, until it has decided n.
func decideWhenAsked(t *testing.T, cp *controlPlane, runID string, d belay.Decision, n int) {
	t.Helper()
	done := make(chan struct{})
	t.Cleanup(func() { close(done) })
	go func() {
		for n > 0 {
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
			}
			// Not the test's goroutine: errors are reported, never Fatal.
			var list wire.ApprovalList
			if err := cp.publicDo("GET", "/v1/runs/"+runID+"/approvals", nil, 200, &list); err != nil {
				t.Errorf("list approvals: %v", err)
				return
			}
			for _, a := range list.Approvals {
				if a.Status == belay.ApprovalPending {
					if err := cp.publicDo("POST", "/v1/runs/"+runID+"/approvals/"+a.ID,
						wire.DecisionRequest{Decision: d, Reason: "looked fine"}, 200, nil); err != nil {
						t.Errorf("decide approval %s: %v", a.ID, err)
						return
					}
					n--
				}
			}
		}
	}()
}

func TestApprovalClientFollowsTheRunsPolicy(t *testing.T) {
	tests := []struct {
		name      string
		policy    belay.ApprovalPolicy
		timeout   int
		person    belay.Decision // what a person answers, if asked
		want      belay.Decision
		decidedBy string
	}{
		{"deny_all", belay.PolicyDenyAll, 0, "", belay.DecisionDeny, "policy"},
		{"allow_all", belay.PolicyAllowAll, 0, "", belay.DecisionAllowOnce, "policy"},
		{"ask, allowed for the session", belay.PolicyAsk, 60, belay.DecisionAllowSession, belay.DecisionAllowSession, "user"},
		{"ask, denied", belay.PolicyAsk, 60, belay.DecisionDeny, belay.DecisionDeny, "user"},
		{"ask, unanswered", belay.PolicyAsk, 1, "", belay.DecisionDeny, "timeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cp := newControlPlane(t, t.TempDir(), scriptedModelScript())
			runID, set := cp.startRun(t, runRequest(tt.policy, tt.timeout))
			logs := &syncBuffer{}
			c := newApprovalClient(t, cp, runID, set.Approvals, time.Duration(max(tt.timeout, 1))*time.Second, logs)
			if tt.person != "" {
				decideWhenAsked(t, cp, runID, tt.person, 1)
			}
			ap, err := c.Approve(context.Background(), sandbox.ToolShell, map[string]string{"command": "ls"})
			if err != nil {
				t.Fatalf("Approve: %v", err)
			}
			if ap.Status != belay.ApprovalDecided || ap.Decision != tt.want || ap.DecidedBy != tt.decidedBy {
				t.Errorf("approval %s/%s by %q; want %s by %q", ap.Status, ap.Decision, ap.DecidedBy, tt.want, tt.decidedBy)
			}
			if strings.Contains(logs.String(), set.Approvals) {
				t.Error("the approvals token appears in the client's log")
			}
		})
	}
}

func TestShellRunsOnlyWhenApproved(t *testing.T) {
	tests := []struct {
		name    string
		policy  belay.ApprovalPolicy
		person  belay.Decision
		ran     bool
		asks    int // approvals the control plane holds after two shell calls
		wantOut string
	}{
		{"deny_all", belay.PolicyDenyAll, "", false, 2, "decision deny by policy"},
		{"ask, denied", belay.PolicyAsk, belay.DecisionDeny, false, 2, "decision deny by user"},
		{"ask, allow_session asks once", belay.PolicyAsk, belay.DecisionAllowSession, true, 1, "exit code 0"},
		{"allow_all", belay.PolicyAllowAll, "", true, 2, "exit code 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			cp := newControlPlane(t, dir, scriptedModelScript())
			runID, set := cp.startRun(t, runRequest(tt.policy, 60))
			w := newWorkspace(t, testFiles)
			tools := newTools(t, w, func(c *sandbox.ToolsConfig) {
				c.Approvals = newApprovalClient(t, cp, runID, set.Approvals, 60*time.Second, io.Discard)
			})
			if tt.person != "" {
				decideWhenAsked(t, cp, runID, tt.person, tt.asks)
			}
			// A command that would leave a trace, and would show the
			// environment: no token may be in it.
			cmd := "echo ran >> " + filepath.Join(w.dir, "shell-trace") + "; env"
			var outs []string
			for range 2 {
				out, _ := call(t, tools, sandbox.ToolShell, map[string]string{"command": cmd})
				outs = append(outs, out)
			}
			if !strings.Contains(outs[0], tt.wantOut) {
				t.Errorf("first shell result %q does not say %q", outs[0], tt.wantOut)
			}
			_, err := os.Stat(filepath.Join(w.dir, "shell-trace"))
			if ran := err == nil; ran != tt.ran {
				t.Errorf("command ran = %v, want %v (results %q)", ran, tt.ran, outs)
			}
			list, err := cp.store.ListApprovals(context.Background(), runID)
			if err != nil {
				t.Fatal(err)
			}
			if len(list) != tt.asks {
				t.Errorf("%d approval requests, want %d", len(list), tt.asks)
			}
			for _, out := range outs {
				for _, secret := range []string{set.Model, set.Events, set.Approvals, providerKeyCanary} {
					if strings.Contains(out, secret) {
						t.Error("a shell result holds a token or key")
					}
				}
			}
		})
	}
}
