package sandbox

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/belay-dev/belay/internal/agent"
	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/sandbox/workspace"
	"github.com/belay-dev/belay/internal/wire"
)

// Reasons a bundle gives for a failed run, besides the agent's own
// ("max_steps", "budget_exhausted", "run_inactive", "model_error").
const (
	ReasonChecksFailed  = "checks_failed"
	ReasonWallTime      = "wall_time_exceeded"
	ReasonTerminated    = "terminated"
	ReasonAgentError    = "agent_error"
	ReasonRunInactive   = agent.ReasonRunInactive
	ReasonPatchTooLarge = "patch_too_large"
	// ReasonRepositoryTampered: the repository could not be vouched for
	// after the agent ran (see ErrRepositoryTampered); no patch is given
	// and no final check runs.
	ReasonRepositoryTampered = "repository_tampered"
)

const (
	// notRunExitCode is a check's exit code when it did not run: the run
	// was stopping, or its wall time was used up.
	notRunExitCode = -1
	// finalizeTimeout bounds committing, diffing and checking out the head
	// after the loop, which happens even when the run is stopping.
	finalizeTimeout = 30 * time.Second
	// straysTimeout bounds waiting for the processes killStrays killed.
	straysTimeout = 5 * time.Second
	// eventsCloseTimeout bounds delivering the last events.
	eventsCloseTimeout = 5 * time.Second
	// uploadTimeout bounds uploading the three outputs, retries included.
	uploadTimeout = 60 * time.Second
	// flushBeforeModelCall bounds how long a model call waits for the
	// events before it to be sent; past it the call goes ahead.
	flushBeforeModelCall = 5 * time.Second
	// maxCheckReserve caps the part of the wall time kept from the agent
	// loop for the final checks (a quarter of it, at most this).
	maxCheckReserve = 60 * time.Second
)

// Main is the sandbox entry in file mode, run by `belay-sandbox
// --workspace DIR` for the workspace folder dir (laid out as package
// workspace says, with spec.json and the token files). It hardens the
// process, takes the tokens, builds the repository, runs the agent loop and
// the checks, and uploads result.json, patch.diff and transcript.jsonl
// through the internal API. It returns the process's exit code: 0 when the
// bundle was uploaded (whatever the run's outcome, which the bundle
// reports), 1 with a line on stderr when it could not be. When ctx ends
// (SIGTERM) the agent loop stops and the bundle is still uploaded.
func Main(ctx context.Context, dir string) int {
	logger := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	e := &entry{now: time.Now, rand: rand.Reader, log: logger}
	return e.exit(e.fileMode(ctx, Workspace(dir)))
}

// MainClaim is the sandbox entry in claim mode, run by `belay-sandbox`
// with no arguments, as the Fargate task definition and the OCI launcher
// start it: its only per-run input is the claim code in BELAY_CLAIM, read
// through getenv with the other workspace.Env* variables. It hardens the
// process, exchanges the code once (POST /internal/v1/claim) for the run's
// spec, tokens and upload targets, and then runs exactly as Main does.
// TaskARN, when set, names the ECS task the entry runs as, for the claim
// to record.
func MainClaim(ctx context.Context, getenv func(string) string, taskARN func(context.Context) string) int {
	logger := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	e := &entry{now: time.Now, rand: rand.Reader, log: logger, taskARN: taskARN}
	return e.exit(e.claimMode(ctx, getenv))
}

type entry struct {
	now     func() time.Time
	rand    io.Reader
	log     *slog.Logger
	taskARN func(context.Context) string
}

func (e *entry) exit(err error) int {
	if err != nil {
		fmt.Fprintf(os.Stderr, "belay-sandbox: %v\n", err)
		return 1
	}
	return 0
}

// session is what a mode hands the common part of the entry: the run's
// spec and tokens, the client that reaches the internal routes, and where
// each output goes.
type session struct {
	ws      Workspace
	spec    belay.SandboxSpec
	tokens  belay.SandboxTokens
	api     *http.Client
	uploads map[string]wire.Upload
	// source is where the run's git source bundle is downloaded from,
	// for a run with one.
	source *wire.Upload
}

// fileMode reads the spec and the token files the launcher left in ws.
func (e *entry) fileMode(ctx context.Context, ws Workspace) error {
	start := e.now()
	if err := Harden(); err != nil {
		return err
	}
	if err := checkAncestors(string(ws)); err != nil {
		return err
	}
	var tokens belay.SandboxTokens
	for _, t := range []struct {
		name string
		dst  *string
	}{{workspace.ModelTokenFile, &tokens.Model}, {workspace.EventsTokenFile, &tokens.Events}, {workspace.ApprovalsTokenFile, &tokens.Approvals}} {
		tok, err := ReadTokenFile(ws.TokensDir(), t.name)
		if err != nil {
			return err
		}
		*t.dst = tok
	}
	spec, err := ReadSpec(ws.SpecPath())
	if err != nil {
		return err
	}
	api, err := NewAPIClient(spec.APISocket, specPeer(spec))
	if err != nil {
		return err
	}
	uploads := make(map[string]wire.Upload, len(belay.ArtifactNames))
	for _, name := range belay.ArtifactNames {
		uploads[name] = wire.Upload{URL: wire.OutputPath(spec.RunID, name), Method: http.MethodPut,
			Header: map[string]string{"Authorization": "Bearer " + tokens.Events}}
	}
	var source *wire.Upload
	if spec.Source != nil {
		source = &wire.Upload{URL: wire.SourcePath(spec.RunID), Method: http.MethodGet,
			Header: map[string]string{"Authorization": "Bearer " + tokens.Events}}
	}
	return e.run(ctx, start, session{ws: ws, spec: spec, tokens: tokens, api: api, uploads: uploads, source: source})
}

// specPeer is the peer check a spec asks for, nil when it names none.
func specPeer(spec belay.SandboxSpec) *APIPeer {
	if spec.APIPeerUID == nil {
		return nil
	}
	return &APIPeer{UID: *spec.APIPeerUID, SharesUID: spec.APIPeerSharesUID}
}

func (e *entry) run(ctx context.Context, start time.Time, se session) error {
	spec, tokens := se.spec, se.tokens
	log := e.log.With("run_id", spec.RunID)
	// The run's one clock: the control plane set the deadline when the run
	// started, so a late launch shortens this sandbox's time, not the run's.
	deadline := spec.Deadline
	ws := se.ws

	// Owner-only, as the local launcher lays it out: home holds git's and
	// Python's configuration, which no other user should read or plant.
	if err := os.MkdirAll(ws.HomeDir(), 0o700); err != nil {
		return fmt.Errorf("workspace: %w", err)
	}
	// The transcript lives in this process's memory until it is uploaded:
	// no file a command could swap, and nothing the control plane reads by
	// path.
	var transcriptBuf bytes.Buffer
	transcript := newTranscriptWriter(&transcriptBuf, belay.MaxArtifactBytes, e.now)

	git := Git{Dir: ws.RepoDir(), Home: ws.HomeDir()}
	var (
		base *Base
		err  error
	)
	files, baseFiles := len(spec.Files), spec.Files
	if spec.Source != nil {
		base, err = e.buildFromSource(ctx, se, git)
		if t := spec.Source.Git.Tree; t != nil {
			files = t.Files
		}
		if err == nil {
			// The fetched tree is the base checkpoints are taken against.
			baseFiles, err = TreeFiles(git.Dir)
		}
	} else {
		base, err = BuildRepo(ctx, git, spec.Files)
	}
	if err != nil {
		return err
	}
	log.Info("repository built", "base_commit", base.Commit, "files", files)
	client := se.api
	// A resumed attempt continues from the run's latest checkpoint: the
	// workspace as it saved it, on the base, and the conversation.
	resume, nextSeq, err := e.restore(ctx, log, se, git)
	if err != nil {
		return err
	}
	// What the workspace holds before the agent runs: whatever else is
	// there afterwards is removed before the final checks.
	layout, err := workspaceNames(string(ws))
	if err != nil {
		return err
	}

	events, err := NewEventClient(EventsConfig{
		BaseURL: spec.APIBaseURL, HTTPClient: client, RunID: spec.RunID, Token: tokens.Events,
		Now: e.now, Rand: e.rand, Logger: log,
		OnCapped: func(message string) {
			writeTranscriptLine(transcript, e.now, map[string]any{"type": "events.capped", "message": truncate(message, 500),
				"note": "the control plane takes no more events from this sandbox; the run goes on, and this transcript keeps the rest"})
		},
	})
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), eventsCloseTimeout)
		defer cancel()
		if err := events.Close(cctx); err != nil {
			log.Warn("events not all delivered", "err", err)
		}
	}()
	approvals := NewApprovalClient(ApprovalsConfig{
		BaseURL: spec.APIBaseURL, HTTPClient: client, RunID: spec.RunID, Token: tokens.Approvals,
		Timeout: time.Duration(spec.Approval.TimeoutSeconds) * time.Second, Now: e.now, Logger: log,
	})
	// The agent loop gets the time left until the deadline less a reserve
	// for the final checks (a quarter of what was left when the entry
	// started); the commands it runs end by the same moment.
	agentDeadline := deadline.Add(-min(max(deadline.Sub(start), 0)/4, maxCheckReserve))
	tools, err := NewTools(ToolsConfig{
		RepoDir: git.Dir, HomeDir: git.Home, AllowedPaths: spec.AllowedPaths, Checks: spec.Checks,
		Deadline: agentDeadline, Approvals: approvals, Events: events, Transcript: transcript, Now: e.now, Logger: log,
	})
	if err != nil {
		return err
	}
	defer tools.Close()
	ready := map[string]any{"baseCommit": base.Commit, "files": files, "attempt": spec.Attempt, "deadline": deadline}
	if resume != nil {
		ready["resumedFromCheckpoint"] = nextSeq - 1
	}
	events.Emit(belay.EventSandboxReady, ready)
	checkpoints := NewCheckpointer(CheckpointerConfig{
		BaseURL: spec.APIBaseURL, HTTPClient: client, RunID: spec.RunID, Attempt: spec.Attempt, Token: tokens.Events,
		RepoDir: git.Dir, Base: baseFiles, NextSeq: nextSeq, FlushEvents: events.Flush, Logger: log,
	})
	defer checkpoints.Close()

	agentCtx, cancelAgent := context.WithDeadline(ctx, agentDeadline)
	defer cancelAgent()
	var runOver atomic.Bool
	go func() {
		select {
		case <-events.Stopped():
			runOver.Store(true)
			log.Info("the control plane says the run is over; stopping the agent")
			cancelAgent()
		case <-agentCtx.Done():
		}
	}()
	// Each model call first sends the events of the steps before it: the
	// control plane logs the call itself, as it passes the proxy.
	modelClient := &http.Client{Transport: flushEventsFirst{events: events, next: client.Transport}}
	outcome, agentErr := agent.Run(agentCtx, agent.Config{
		BaseURL:     strings.TrimSuffix(spec.APIBaseURL, "/") + "/internal/v1",
		HTTPClient:  modelClient,
		Token:       tokens.Model,
		Model:       spec.Model,
		Instruction: spec.Instruction,
		MaxSteps:    spec.MaxSteps,
		// A session's turn starts with the earlier turns' conversation
		// and the session's skills.
		Conversation: turnConversation(spec.Turn),
		Skills:       turnSkills(spec.Turn),
		Tools:        tools,
		Events:       events,
		Transcript:   transcript,
		Logger:       log,

		Resume:            resume,
		InterruptedReason: interruptedReason(spec.Lost, spec.Attempt),
		Checkpoint:        checkpoints.Save,
	})
	cancelAgent()
	checkpoints.Close()
	if n, size, took := checkpoints.Stats(); n > 0 {
		log.Info("checkpoints saved", "checkpoints", n, "bytes", size, "took_ms", took.Milliseconds())
	}
	reason := agentReason(outcome, agentErr, runOver.Load(), ctx.Err() != nil,
		errors.Is(agentCtx.Err(), context.DeadlineExceeded))
	if agentErr != nil {
		log.Warn("agent loop ended with an error", "reason", reason, "err", agentErr)
	}
	log.Info("agent outcome", "reason", reason, "steps", outcome.Steps)

	// The head commit is made, and the work tree made exactly its tree,
	// before the final checks, so they run on the files the patch produces
	// and nothing else. This happens even when the run is stopping: what
	// the agent did so far is worth keeping.
	e.killStrays(log)
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finalizeTimeout)
	defer cancel()
	fin, err := base.Finalize(fctx, spec.AllowedPaths, "belay: agent changes")
	if err != nil && !errors.Is(err, ErrRepositoryTampered) {
		return err
	}
	tamperedErr := err
	if err == nil {
		if len(fin.Discarded) > 0 {
			log.Warn("changes outside the allowed paths were left out of the patch", "paths", len(fin.Discarded))
			writeTranscriptLine(transcript, e.now, map[string]any{"type": "changes.discarded", "paths": fin.Discarded,
				"note": "changed paths outside allowedPaths, or not regular files, are not part of the patch; the final checks ran without them"})
		}
		if err := resetWorkspace(string(ws), layout, git.Home); err != nil {
			return err
		}
	}

	// The final checks run unless the run is being stopped or the
	// repository cannot be vouched for. Each runs on the head tree as
	// Finalize left it: a check runs the patch's code, which may change
	// what the next one would see.
	stopping := ctx.Err() != nil || runOver.Load()
	checks := make([]belay.CheckResult, len(spec.Checks))
	for i, argv := range spec.Checks {
		if i > 0 && tamperedErr == nil && !stopping && ctx.Err() == nil {
			tamperedErr = e.resetForCheck(ctx, ws, base, fin.Head, layout, git.Home)
			if tamperedErr != nil && !errors.Is(tamperedErr, ErrRepositoryTampered) {
				return tamperedErr
			}
		}
		if tamperedErr != nil {
			checks[i] = belay.CheckResult{Argv: argv, ExitCode: notRunExitCode,
				OutputTail: "[belay: not run: the repository was tampered with]"}
			continue
		}
		checks[i] = e.finalCheck(ctx, git, argv, deadline, stopping, transcript)
		e.killStrays(log)
	}
	if tamperedErr != nil {
		log.Warn("the repository was tampered with; the run fails without a patch", "err", tamperedErr)
		writeTranscriptLine(transcript, e.now, map[string]any{"type": "repository.tampered", "error": tamperedErr.Error()})
		reason = ReasonRepositoryTampered
		fin = Final{Head: base.Commit, Changed: []string{}}
	}
	if dropped, err := transcript.loss(); dropped > 0 || err != nil {
		log.Warn("the transcript is incomplete", "dropped_bytes", dropped, "err", err)
	}
	// Nothing the agent started is left to touch the outputs (killStrays
	// ran after the last check).
	return e.uploadBundle(ctx, log, se, base.Commit, fin, outcome, reason, checks, transcript, &transcriptBuf)
}

// uploadBundle builds result.json for the head commit Finalize made and
// uploads patch.diff, transcript.jsonl and then result.json (last: its
// presence means the bundle is whole). The run completed only if the agent
// finished and every check exited 0.
func (e *entry) uploadBundle(ctx context.Context, log *slog.Logger, se session, base string, fin Final,
	outcome agent.Outcome, reason string, checks []belay.CheckResult, transcript *transcriptWriter, transcriptBuf *bytes.Buffer) error {
	spec := se.spec
	patch, changed := fin.Patch, fin.Changed
	allPassed := true
	for _, c := range checks {
		allPassed = allPassed && c.ExitCode == 0
	}
	bundle := belay.ResultBundle{
		Version: belay.ResultBundleVersion, RunID: spec.RunID,
		Summary:      truncateBytes(outcome.Summary, belay.MaxSummaryBytes),
		ChangedFiles: changed, Checks: checks, Usage: outcome.Usage,
		BaseCommit: base, HeadCommit: fin.Head,
	}
	switch {
	case len(patch) > belay.MaxArtifactBytes:
		// No artifact may be that large; report the run failed, with no
		// patch rather than a cut one.
		bundle.Reason = ReasonPatchTooLarge
		patch, bundle.ChangedFiles = nil, []string{}
	case reason != agent.ReasonFinished:
		bundle.Reason = reason
	case !allPassed:
		bundle.Reason = ReasonChecksFailed
	}
	if bundle.Reason == "" {
		bundle.Status, bundle.ExitCode = belay.StatusCompleted, 0
	} else {
		bundle.Status, bundle.ExitCode = belay.StatusFailed, 1
	}
	result, err := json.MarshalIndent(bundle, "", "  ")
	if err != nil {
		return fmt.Errorf("encode result: %w", err)
	}
	if patch == nil {
		patch = []byte{}
	}
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), uploadTimeout)
	defer cancel()
	u := uploader{api: se.api, base: spec.APIBaseURL, targets: se.uploads, log: log}
	for _, out := range []struct {
		name    string
		content []byte
	}{{"patch.diff", patch}, {"transcript.jsonl", transcript.snapshot(transcriptBuf)}, {"result.json", append(result, '\n')}} {
		err := u.put(uctx, out.name, out.content)
		if errors.Is(err, errRunOver) {
			// Cancelled, or ended by the control plane: it decided the
			// outcome without this bundle, and there is nothing to fix.
			log.Info("the control plane takes no outputs: the run is over", "status", bundle.Status, "reason", bundle.Reason)
			return nil
		}
		if err != nil {
			return err
		}
	}
	log.Info("result uploaded", "status", bundle.Status, "reason", bundle.Reason, "changed_files", len(changed))
	return nil
}

// agentReason names how the agent loop ended, in the bundle's terms. The
// entry's own view comes first: a loop that ended because the control plane
// said the run is over, because of SIGTERM, or because the wall time was up
// reports that, whatever the loop made of it (a refused or failed model
// call, say).
func agentReason(o agent.Outcome, err error, runOver, terminated, wallTimeUp bool) string {
	switch {
	case runOver:
		return ReasonRunInactive
	case terminated:
		return ReasonTerminated
	case o.Finished && err == nil:
		return agent.ReasonFinished
	case wallTimeUp:
		return ReasonWallTime
	case err == nil && o.Reason != "" && o.Reason != agent.ReasonFinished:
		return o.Reason
	}
	return ReasonAgentError
}

// finalCheck runs one of the run's checks after the agent loop, or records
// why it did not run.
func (e *entry) finalCheck(ctx context.Context, git Git, argv []string, deadline time.Time, stopping bool, transcript io.Writer) belay.CheckResult {
	cr := belay.CheckResult{Argv: argv, ExitCode: notRunExitCode}
	left := deadline.Sub(e.now())
	switch {
	case stopping:
		cr.OutputTail = "[belay: not run: the run is stopping]"
		return cr
	case left <= 0:
		cr.OutputTail = "[belay: not run: the run's wall time is used up]"
		return cr
	}
	res, err := RunCommand(ctx, Command{Argv: argv, Dir: git.Dir, Env: CleanEnv(git.Home), Timeout: min(DefaultCheckTimeout, left)})
	if err != nil {
		cr.OutputTail = "[belay: not run: " + err.Error() + "]"
		return cr
	}
	cr.ExitCode, cr.DurationMs, cr.OutputTail = res.ExitCode, res.Duration.Milliseconds(), res.Tail(ResultTailBytes)
	// No check.finished event: a final check is the control plane's to
	// report, from the bundle it validates.
	writeTranscriptLine(transcript, e.now, commandRecord{
		Type: "command", Time: e.now().UTC().Format(time.RFC3339Nano), Tool: "final_check", Argv: argv,
		ExitCode: res.ExitCode, DurationMs: cr.DurationMs, TimedOut: res.TimedOut, Interrupted: res.Interrupted,
		OutputBytes: res.OutputBytes, Output: res.Tail(TranscriptTailBytes),
	})
	return cr
}

// flushEventsFirst is the model client's transport: it flushes the
// sandbox's queued events before each request (see EventClient.Flush), so
// the run's log keeps the order things happened in. A flush that fails or
// takes too long does not hold the model call back.
type flushEventsFirst struct {
	events *EventClient
	next   http.RoundTripper
}

func (f flushEventsFirst) RoundTrip(r *http.Request) (*http.Response, error) {
	ctx, cancel := context.WithTimeout(r.Context(), flushBeforeModelCall)
	_ = f.events.Flush(ctx)
	cancel()
	return f.next.RoundTrip(r)
}

// resetForCheck puts the repository and the workspace back as they were
// before the first final check (see Base.Reset).
func (e *entry) resetForCheck(ctx context.Context, ws Workspace, base *Base, head string, layout map[string]bool, home string) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finalizeTimeout)
	defer cancel()
	if err := base.Reset(rctx, head); err != nil {
		return err
	}
	return resetWorkspace(string(ws), layout, home)
}

// killStrays kills whatever the agent's commands left running outside
// their process groups (see killStrays in sysproc), before the entry reads
// the tree it vouches for and after each final check.
func (e *entry) killStrays(log *slog.Logger) {
	n, err := killStrays(straysTimeout)
	if err != nil {
		log.Warn("could not kill the processes left behind", "err", err)
	} else if n > 0 {
		log.Info("killed processes left behind by commands", "processes", n)
	}
}

// workspaceNames lists the names in the workspace folder.
func workspaceNames(ws string) (map[string]bool, error) {
	entries, err := os.ReadDir(ws)
	if err != nil {
		return nil, fmt.Errorf("workspace: %w", err)
	}
	names := make(map[string]bool, len(entries))
	for _, e := range entries {
		names[e.Name()] = true
	}
	return names, nil
}

// resetWorkspace removes what the agent's commands added to the workspace
// folder (every name not in layout) and empties home. Both are outside the
// repository, yet a check can read them: the workspace is the repository's
// parent, where pytest looks for its configuration (a pytest.ini there
// could add --collect-only), and home holds git's ~/.gitconfig and
// Python's user site-packages.
func resetWorkspace(ws string, layout map[string]bool, home string) error {
	entries, err := os.ReadDir(ws)
	if err != nil {
		return fmt.Errorf("workspace: %w", err)
	}
	for _, e := range entries {
		if !layout[e.Name()] {
			if err := removeAll(filepath.Join(ws, e.Name())); err != nil {
				return fmt.Errorf("workspace: remove what the agent left: %w", err)
			}
		}
	}
	if err := removeAll(home); err != nil {
		// In the local launcher's layout the workspace folder is root's:
		// home's content is gone, but home itself cannot be removed (nor
		// replaced by a command), and stays.
		if fi, lerr := os.Lstat(home); lerr != nil || !fi.IsDir() {
			return fmt.Errorf("workspace: empty home: %w", err)
		}
		if left, rerr := os.ReadDir(home); rerr != nil || len(left) > 0 {
			return fmt.Errorf("workspace: empty home: %w", err)
		}
		if err := os.Chmod(home, 0o700); err != nil {
			return fmt.Errorf("workspace: empty home: %w", err)
		}
		return nil
	}
	if err := os.Mkdir(home, 0o700); err != nil {
		return fmt.Errorf("workspace: empty home: %w", err)
	}
	return nil
}

// restore reads the run's latest checkpoint for an attempt after the first
// and applies its workspace change to the freshly built repository. It
// returns the agent state to resume from (nil to start over: the first
// attempt, or a run whose lost sandbox saved no checkpoint) and the
// sequence number the attempt's own checkpoints start at.
func (e *entry) restore(ctx context.Context, log *slog.Logger, se session, git Git) (*agent.State, int64, error) {
	spec := se.spec
	if spec.Attempt <= 1 {
		return nil, 1, nil
	}
	cp, err := FetchCheckpoint(ctx, se.api, spec.APIBaseURL, spec.RunID, se.tokens.Events)
	switch {
	case errors.Is(err, errNoCheckpoint):
		log.Info("resumed without a checkpoint: the run starts over on its base", "attempt", spec.Attempt)
		return nil, 1, nil
	case err != nil:
		return nil, 0, err
	case cp.Unresumable != "":
		return nil, 0, fmt.Errorf("the latest checkpoint cannot be resumed from: %s", truncate(cp.Unresumable, 300))
	}
	st, err := agent.DecodeState(cp.Agent)
	if err != nil {
		return nil, 0, fmt.Errorf("checkpoint %d: %w", cp.Seq, err)
	}
	if err := ApplyWorkspaceChange(git.Dir, cp.Workspace); err != nil {
		return nil, 0, fmt.Errorf("checkpoint %d: %w", cp.Seq, err)
	}
	pending := ""
	if st.Pending != nil {
		pending = st.Pending.Name
	}
	log.Info("resumed from a checkpoint", "attempt", spec.Attempt, "seq", cp.Seq, "step", cp.Step,
		"pending", pending, "files", len(cp.Workspace.Files))
	return &st, cp.Seq + 1, nil
}

func turnConversation(t *belay.TurnContext) []belay.ConversationMessage {
	if t == nil {
		return nil
	}
	return t.Conversation
}

func turnSkills(t *belay.TurnContext) []belay.Skill {
	if t == nil {
		return nil
	}
	return t.Skills
}
