package sandbox

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/belay-dev/belay/internal/agent"
	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/wire"
)

// Timing of checkpoints. A tool call that runs longer than
// progressInterval (a long shell command, a check) is checkpointed again
// every progressInterval while it runs, whenever the workspace changed, so
// what the command did before its sandbox was lost survives the loss.
// saveTimeout bounds one save, retries included; a checkpoint the control
// plane does not take in time is given up (the run goes on, and a resume
// would start from the one before).
const (
	progressInterval = 2 * time.Second
	saveTimeout      = 20 * time.Second
	saveAttempts     = 3
	saveBackoff      = 250 * time.Millisecond
)

// CheckpointerConfig configures a Checkpointer.
type CheckpointerConfig struct {
	// BaseURL is the spec's APIBaseURL; HTTPClient reaches it. Token is
	// the run's events token.
	BaseURL    string
	HTTPClient *http.Client
	RunID      string
	Attempt    int
	Token      string
	// RepoDir is the repository; Base its base files (the spec's).
	RepoDir string
	Base    []belay.File
	// NextSeq is the first sequence number to use: one more than the
	// checkpoint a resumed attempt continues from, 1 otherwise.
	NextSeq int64
	// ProgressInterval defaults to progressInterval.
	ProgressInterval time.Duration
	// FlushEvents, when set, delivers the events emitted so far; it is
	// called before a pending call is saved, so the log has the call's
	// tool.call before the call can run (and die with its sandbox).
	FlushEvents func(ctx context.Context) error
	Logger      *slog.Logger
}

// Checkpointer saves the run's checkpoints (DESIGN.md "Checkpoints and
// resume"): Save is the agent loop's Config.Checkpoint. Each checkpoint is
// the loop's state and the workspace's change since the base, uploaded
// with PUT /internal/v1/runs/{id}/checkpoints/{seq} before the loop goes
// on. While a call is pending, a goroutine saves again every
// ProgressInterval when the workspace changed. One over
// belay.MaxCheckpointBytes is saved as an unresumable marker instead. When
// the control plane takes no more (409: the run is over or moved on),
// saving stops for good.
type Checkpointer struct {
	cfg   CheckpointerConfig
	base  map[string]string
	route apiRoute
	log   *slog.Logger

	// mu orders saves and guards what follows.
	mu       sync.Mutex
	seq      int64
	stopped  bool
	lastWork [sha256.Size]byte // the workspace change last saved
	saved    int
	bytes    int64
	took     time.Duration

	// progress ends the goroutine of the pending call, if any.
	progress     context.CancelFunc
	progressDone chan struct{}
}

// NewCheckpointer returns a Checkpointer for one attempt.
func NewCheckpointer(cfg CheckpointerConfig) *Checkpointer {
	if cfg.ProgressInterval <= 0 {
		cfg.ProgressInterval = progressInterval
	}
	if cfg.NextSeq < 1 {
		cfg.NextSeq = 1
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Checkpointer{
		cfg: cfg, base: baseContents(cfg.Base), log: cfg.Logger, seq: cfg.NextSeq - 1,
		route: apiRoute{client: cfg.HTTPClient, base: cfg.BaseURL, token: cfg.Token},
	}
}

// Save saves s and, for a pending call, keeps saving its progress until
// the next Save or Close. It returns when the checkpoint is stored, given
// up or refused: a call never runs before the state marking it pending is
// stored (when it can be).
func (c *Checkpointer) Save(ctx context.Context, s agent.State) {
	c.stopProgress()
	if s.Pending != nil && c.cfg.FlushEvents != nil {
		fctx, cancel := context.WithTimeout(ctx, flushBeforeModelCall)
		_ = c.cfg.FlushEvents(fctx)
		cancel()
	}
	agentState, err := json.Marshal(s)
	if err != nil {
		c.log.Error("encode the agent state", "err", err)
		return
	}
	c.mu.Lock()
	c.save(ctx, s, agentState, false)
	c.mu.Unlock()
	if s.Pending != nil && s.Outcome == nil {
		pctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		done := make(chan struct{})
		c.mu.Lock()
		c.progress, c.progressDone = cancel, done
		c.mu.Unlock()
		go c.keepSaving(pctx, done, s, agentState)
	}
}

// keepSaving saves the pending call's progress every ProgressInterval when
// the workspace changed.
func (c *Checkpointer) keepSaving(ctx context.Context, done chan struct{}, s agent.State, agentState []byte) {
	defer close(done)
	t := time.NewTicker(c.cfg.ProgressInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c.mu.Lock()
		if ctx.Err() == nil {
			c.save(ctx, s, agentState, true)
		}
		c.mu.Unlock()
	}
}

// stopProgress ends the pending call's goroutine and waits for it.
func (c *Checkpointer) stopProgress() {
	c.mu.Lock()
	cancel, done := c.progress, c.progressDone
	c.progress, c.progressDone = nil, nil
	c.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// Close stops saving progress. Saved checkpoints stay.
func (c *Checkpointer) Close() { c.stopProgress() }

// Stats reports what was saved: checkpoints, their bytes in all, and the
// time spent saving them.
func (c *Checkpointer) Stats() (saved int, bytes int64, took time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.saved, c.bytes, c.took
}

// save builds and uploads one checkpoint; with onlyIfChanged, only when
// the workspace changed since the last one. c.mu is held.
func (c *Checkpointer) save(ctx context.Context, s agent.State, agentState []byte, onlyIfChanged bool) {
	if c.stopped {
		return
	}
	start := time.Now()
	cp := wire.Checkpoint{Version: wire.CheckpointVersion, RunID: c.cfg.RunID, Attempt: c.cfg.Attempt, Seq: c.seq + 1, Step: s.Steps}
	if s.Pending != nil {
		cp.Pending = &wire.PendingCall{ID: s.Pending.ID, Name: s.Pending.Name, Step: s.Pending.Step, Since: s.Pending.Since}
	}
	change, err := WorkspaceChange(c.cfg.RepoDir, c.base)
	var body []byte
	switch {
	case errors.Is(err, errChangeTooLarge):
		cp.Unresumable = truncate(err.Error(), belay.MaxUnresumableLen-4)
	case err != nil:
		c.log.Warn("checkpoint not saved: the workspace could not be read", "err", err)
		return
	default:
		work, err := json.Marshal(change)
		if err != nil {
			c.log.Error("encode the workspace change", "err", err)
			return
		}
		sum := sha256.Sum256(work)
		if onlyIfChanged && sum == c.lastWork {
			return
		}
		cp.Agent, cp.Workspace = agentState, change
		// The change is encoded once: its bytes are both what is hashed
		// and what is sent.
		if body, err = json.Marshal(encodedCheckpoint{cp, work}); err != nil {
			c.log.Error("encode the checkpoint", "err", err)
			return
		}
		if len(body) > belay.MaxCheckpointBytes {
			cp.Agent, cp.Workspace = nil, wire.WorkspaceChange{}
			cp.Unresumable = fmt.Sprintf("the checkpoint is %d bytes; at most %d may be saved", len(body), belay.MaxCheckpointBytes)
			body = nil
		} else {
			c.lastWork = sum
		}
	}
	if body == nil {
		c.lastWork = [sha256.Size]byte{}
		cp.Workspace.Files = []wire.FileChange{}
		if body, err = json.Marshal(cp); err != nil {
			c.log.Error("encode the checkpoint", "err", err)
			return
		}
		c.log.Warn("checkpoint too large: saved as unresumable; a lost sandbox will not be replaced until a smaller one is saved",
			"seq", cp.Seq, "reason", cp.Unresumable)
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), saveTimeout)
	defer cancel()
	err = c.upload(sctx, cp.Seq, body)
	took := time.Since(start)
	var ae *APIError
	switch {
	case errors.As(err, &ae) && ae.Status == http.StatusConflict:
		c.stopped = true
		c.log.Info("the control plane takes no more checkpoints: the run is over or moved on", "seq", cp.Seq, "err", err)
		return
	case err != nil:
		// The sequence number is kept for the next: the control plane may
		// have stored this one even so, and a number is never reused.
		c.seq = cp.Seq
		c.lastWork = [sha256.Size]byte{}
		c.log.Warn("checkpoint not saved", "seq", cp.Seq, "err", err)
		return
	}
	c.seq = cp.Seq
	c.saved++
	c.bytes += int64(len(body))
	c.took += took
	pending := ""
	if cp.Pending != nil {
		pending = cp.Pending.Name
	}
	c.log.Debug("checkpoint saved", "seq", cp.Seq, "step", cp.Step, "pending", pending, "files", len(cp.Workspace.Files),
		"size", len(body), "took_ms", took.Milliseconds())
}

// upload PUTs one checkpoint, retrying what may succeed on a second try.
func (c *Checkpointer) upload(ctx context.Context, seq int64, body []byte) error {
	u := c.route.url("internal", "v1", "runs", c.cfg.RunID, "checkpoints", fmt.Sprint(seq))
	wait := saveBackoff
	for attempt := 1; ; attempt++ {
		err := c.put(ctx, u, body)
		if err == nil || !retryable(err) || attempt == saveAttempts || !sleepCtx(ctx, wait) {
			return err
		}
		wait *= 2
	}
}

func (c *Checkpointer) put(ctx context.Context, u string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, u, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.cfg.Token)
	req.Header.Set("Content-Type", "application/json")
	req.ContentLength = int64(len(body))
	resp, err := c.route.client.Do(req)
	if err != nil {
		return unwrapURLError(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, maxAPIResponse))
	if resp.StatusCode >= 200 && resp.StatusCode <= 299 {
		return nil
	}
	ae := &APIError{Status: resp.StatusCode}
	if eb, ok := decodeErrorBody(data); ok {
		ae.Code, ae.Message, ae.RequestID = eb.Error.Code, truncate(eb.Error.Message, 500), eb.Error.RequestID
	}
	return ae
}

// errNoCheckpoint is a run without a checkpoint to resume from.
var errNoCheckpoint = errors.New("the run has no checkpoint")

// FetchCheckpoint reads the run's latest checkpoint (GET
// /internal/v1/runs/{id}/checkpoints/latest) and checks that it is one of
// this run, in this format. It returns errNoCheckpoint when the run has
// none.
func FetchCheckpoint(ctx context.Context, client *http.Client, baseURL, runID, eventsToken string) (wire.Checkpoint, error) {
	route := apiRoute{client: client, base: baseURL, token: eventsToken}
	u := route.url("internal", "v1", "runs", runID, "checkpoints", "latest")
	var cp wire.Checkpoint
	wait := saveBackoff
	for attempt := 1; ; attempt++ {
		body, err := route.get(ctx, u, belay.MaxCheckpointBytes)
		var ae *APIError
		switch {
		case errors.As(err, &ae) && ae.Status == http.StatusNotFound:
			return cp, errNoCheckpoint
		case err != nil && retryable(err) && attempt < saveAttempts && sleepCtx(ctx, wait):
			wait *= 2
			continue
		case err != nil:
			return cp, fmt.Errorf("read the latest checkpoint: %w", err)
		}
		if err := json.Unmarshal(body, &cp); err != nil {
			return cp, fmt.Errorf("read the latest checkpoint: %w", err)
		}
		switch {
		case cp.Version != wire.CheckpointVersion:
			return cp, fmt.Errorf("the latest checkpoint has version %d; this sandbox reads %d", cp.Version, wire.CheckpointVersion)
		case cp.RunID != runID:
			return cp, errors.New("the latest checkpoint is another run's")
		}
		return cp, nil
	}
}

// get sends a GET with the route's token and returns a 2xx answer's body,
// up to limit bytes.
func (r apiRoute) get(ctx context.Context, u string, limit int64) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+r.token)
	req.Header.Set("Accept", "application/json")
	resp, err := r.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", pathOf(u), unwrapURLError(err))
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, fmt.Errorf("GET %s: read answer: %w", pathOf(u), err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		ae := &APIError{Status: resp.StatusCode}
		if eb, ok := decodeErrorBody(data); ok {
			ae.Code, ae.Message, ae.RequestID = eb.Error.Code, truncate(eb.Error.Message, 500), eb.Error.RequestID
		}
		return nil, ae
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("GET %s: answer larger than %d bytes", pathOf(u), limit)
	}
	return data, nil
}

// interruptedReason is what the model is told of the call its lost
// sandbox was running.
func interruptedReason(lost *belay.LostAttempt, attempt int) string {
	how := "was lost"
	if lost != nil && lost.Reason != "" {
		how = "was lost (" + strings.TrimSpace(truncate(lost.Reason, 200)) + ")"
	}
	return fmt.Sprintf("the sandbox running this call %s, and the run resumed on a new sandbox (attempt %d). "+
		"The call was not run again. The workspace is as the last checkpoint saved it, which may hold part of what the call changed.", how, attempt)
}

// unwrapURLError drops the *url.Error wrapper, whose text repeats the
// URL, to keep a message short.
func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// encodedCheckpoint is a wire.Checkpoint whose workspace change is
// already encoded.
type encodedCheckpoint struct {
	wire.Checkpoint
	Workspace json.RawMessage `json:"workspace"`
}
