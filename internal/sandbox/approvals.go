package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/wire"
)

// ApprovalsConfig configures an ApprovalClient.
type ApprovalsConfig struct {
	BaseURL    string
	HTTPClient *http.Client
	RunID      string
	// Token is the run's approvals token.
	Token string
	// Timeout is how long the control plane waits for a person (the run's
	// approval timeout); the client waits Timeout plus Grace for a
	// decision, then denies on its own.
	Timeout time.Duration
	Grace   time.Duration
	// PollInterval is the wait between reads of a pending approval
	// (default 500 ms).
	PollInterval time.Duration
	Now          func() time.Time
	Logger       *slog.Logger
}

// DefaultApprovalGrace is how much longer than the run's approval timeout
// the sandbox waits for the control plane to decide a pending approval.
const DefaultApprovalGrace = 5 * time.Second

// ApprovalClient asks the control plane to approve tool calls. The control
// plane applies the run's policy: deny_all, allow_all and allow_list
// answers come back decided; an ask comes back pending and is polled until
// a person (or the control plane's timeout) decides it.
type ApprovalClient struct {
	cfg   ApprovalsConfig
	route apiRoute
}

// NewApprovalClient returns a client for one run's approvals.
func NewApprovalClient(cfg ApprovalsConfig) *ApprovalClient {
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = 500 * time.Millisecond
	}
	if cfg.Grace <= 0 {
		cfg.Grace = DefaultApprovalGrace
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 120 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &ApprovalClient{cfg: cfg, route: apiRoute{client: cfg.HTTPClient, base: cfg.BaseURL, token: cfg.Token}}
}

// Approve requests approval of one tool call and waits for the decision.
// If none comes within Timeout plus Grace it returns a deny decided by
// "timeout". An error means the request could not be made or the answers
// could not be read; the caller treats it as a denial.
func (c *ApprovalClient) Approve(ctx context.Context, tool string, args any) (belay.Approval, error) {
	raw, err := json.Marshal(args)
	if err != nil {
		return belay.Approval{}, fmt.Errorf("request approval of %s: encode arguments: %w", tool, err)
	}
	if len(raw) > wire.MaxApprovalBody-256 {
		return belay.Approval{}, fmt.Errorf("request approval of %s: arguments are %d bytes, too large to ask about", tool, len(raw))
	}
	give := c.cfg.Now().Add(c.cfg.Timeout + c.cfg.Grace)
	var ap belay.Approval
	u := c.route.url("internal", "v1", "runs", c.cfg.RunID, "approvals")
	// The request is not retried: the route has no idempotency key, and a
	// second request would ask the person twice.
	rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	err = c.route.do(rctx, http.MethodPost, u, wire.ApprovalRequest{Tool: tool, Arguments: raw}, &ap)
	cancel()
	if err != nil {
		return belay.Approval{}, fmt.Errorf("request approval of %s: %w", tool, err)
	}
	if ap.ID == "" {
		return belay.Approval{}, fmt.Errorf("request approval of %s: the answer has no approvalId", tool)
	}
	c.cfg.Logger.Info("approval requested", "tool", tool, "approval_id", ap.ID, "status", ap.Status)

	poll := c.route.url("internal", "v1", "runs", c.cfg.RunID, "approvals", ap.ID)
	for ap.Status != belay.ApprovalDecided {
		if !c.cfg.Now().Before(give) {
			c.cfg.Logger.Info("approval not decided in time; denying", "approval_id", ap.ID)
			return timedOut(ap, c.cfg.Timeout+c.cfg.Grace), nil
		}
		if !sleepCtx(ctx, c.cfg.PollInterval) {
			return belay.Approval{}, fmt.Errorf("wait for approval %s: %w", ap.ID, ctx.Err())
		}
		var next belay.Approval
		rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		err := c.route.do(rctx, http.MethodGet, poll, nil, &next)
		cancel()
		switch {
		case err == nil:
			ap = next
		case retryable(err) && ctx.Err() == nil:
			// A poll that failed in transit is simply made again.
			c.cfg.Logger.Warn("approval poll failed; retrying", "approval_id", ap.ID, "err", err)
		default:
			return belay.Approval{}, fmt.Errorf("wait for approval %s: %w", ap.ID, err)
		}
	}
	if !ap.Decision.Valid() {
		return belay.Approval{}, fmt.Errorf("approval %s: decided with unknown decision %q", ap.ID, truncate(string(ap.Decision), 40))
	}
	c.cfg.Logger.Info("approval decided", "approval_id", ap.ID, "decision", ap.Decision, "decided_by", ap.DecidedBy)
	return ap, nil
}

func timedOut(ap belay.Approval, waited time.Duration) belay.Approval {
	ap.Status = belay.ApprovalDecided
	ap.Decision = belay.DecisionDeny
	ap.DecidedBy = "timeout"
	ap.Reason = fmt.Sprintf("no decision within %s", waited.Round(time.Second))
	return ap
}
