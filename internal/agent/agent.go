// Package agent is the coding agent's loop, run inside the sandbox. It asks
// the model what to do next through belay's model proxy (an OpenAI-compatible
// chat-completions route, with the run's model token as the bearer), runs the
// tool calls it answers through Tools, feeds the results back, and stops when
// the model calls finish, the step budget is spent, or the proxy says the run
// may not call the model any more.
//
// The model is untrusted input: whatever it asks goes through Tools, which
// enforce the run's rules (allowed paths, approvals); a tool error is a
// result the model reads, never a failure of the loop. Every call is
// reported as tool.call and tool.result events (bounded in size) and written
// to the transcript, the JSON-lines artifact a person reads afterwards. The
// model token never appears in either, nor in logs.
package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/belay-dev/belay/internal/belay"
)

// ToolDef describes one tool to the model. Parameters is its arguments' JSON
// schema (an object schema).
type ToolDef struct {
	Name        string
	Description string
	Parameters  map[string]any
}

// Tools runs the agent's tool calls. The sandbox implements it; the loop only
// relays what the model asks.
type Tools interface {
	// Definitions lists the tools offered to the model. A "finish" entry is
	// not needed: the loop handles finish itself (see FinishTool).
	Definitions() []ToolDef
	// Call runs one tool call. It never panics; a failure (bad arguments,
	// a refused path, a denied approval) is a result with isError set, which
	// the model reads and can act on.
	Call(ctx context.Context, name string, args json.RawMessage) (result string, isError bool)
}

// EventSink receives the loop's events (tool.call, tool.result,
// agent.message). Emit is fire-and-forget: the sink batches and delivers, so
// a slow control plane never stalls the loop.
type EventSink interface {
	Emit(typ string, data any)
}

// Config is what one run of the loop needs.
type Config struct {
	// BaseURL is the model proxy's API root, for example
	// "http://belay/internal/v1"; requests go to BaseURL + "/chat/completions".
	BaseURL string
	// HTTPClient carries the requests (over the workspace's Unix socket
	// locally); nil means http.DefaultClient.
	HTTPClient *http.Client
	// Token is the run's model token, sent as the bearer. It is never
	// logged, emitted or written to the transcript.
	Token string

	Model       string
	Instruction string
	// MaxSteps bounds the model calls of the run.
	MaxSteps int

	Tools Tools
	// Events, Transcript and Logger may be nil.
	Events     EventSink
	Transcript io.Writer
	Logger     *slog.Logger

	// Conversation, for a session's turn, is the earlier turns'
	// conversation (compacted by the control plane): it goes between the
	// system prompt and Instruction. Skills are the session's skills:
	// their names and descriptions go into the system prompt, and the
	// model reads a body with the read_skill tool (ReadSkillTool).
	Conversation []belay.ConversationMessage
	Skills       []belay.Skill

	// Resume, when set, is a checkpoint's state to continue from (see
	// State): the loop restores the conversation, its steps and usage,
	// answers the tool call that was running with an Interrupted result
	// (InterruptedReason says why; it is never run again) and the calls
	// after it as not run, and goes on from there. Instruction and
	// MaxSteps still apply; the restored system prompt is kept.
	Resume            *State
	InterruptedReason string
	// Checkpoint, when set, receives the loop's state at each checkpoint
	// (see CheckpointFunc).
	Checkpoint CheckpointFunc
}

// DefaultInterruptedReason is the reason an interrupted call's result
// gives when Config.InterruptedReason is empty.
const DefaultInterruptedReason = "the sandbox running this call was lost and the run resumed on a new one; the call was not run again"

// Outcome is how the loop ended. Reason is one of the Reason constants.
// Finished reports that the model said it was done: it called finish, or,
// after being reminded to call finish, answered in text again (that text is
// then the Summary).
type Outcome struct {
	Finished bool              `json:"finished"`
	Summary  string            `json:"summary"`
	Steps    int               `json:"steps"`
	Reason   string            `json:"reason"`
	Usage    belay.BundleUsage `json:"usage"`
}

// The reasons a loop ends.
const (
	// ReasonFinished: the model finished (see Outcome.Finished).
	ReasonFinished = "finished"
	// ReasonMaxSteps: MaxSteps model calls were made without a finish.
	ReasonMaxSteps = "max_steps"
	// ReasonBudgetExhausted: the proxy answered 429
	// model_request_budget_exhausted; the run's model budget is spent.
	ReasonBudgetExhausted = "budget_exhausted"
	// ReasonRunInactive: the proxy answered 401; the run was cancelled,
	// expired or its token revoked, so the loop stops at once.
	ReasonRunInactive = "run_inactive"
	// ReasonModelError: any other failure to get a usable answer.
	ReasonModelError = "model_error"
	// ReasonCancelled: ctx ended.
	ReasonCancelled = "cancelled"
)

// FinishTool is the tool the model calls to end the run with a summary. The
// loop handles it; Tools.Call never sees it.
const FinishTool = "finish"

// Size bounds. Event payloads stay small so a batch of them fits the
// internal events route; the model's context and the transcript get more.
const (
	// MaxEventTextBytes caps each text field of an event (arguments,
	// results, messages).
	MaxEventTextBytes = 2 << 10
	// MaxToolResultBytes caps a tool result as the model and transcript see it.
	MaxToolResultBytes = 64 << 10
	// MaxSummaryBytes caps the summary the model gives to finish, truncation
	// note included: it is the result bundle's cap (belay.MaxSummaryBytes),
	// so the sandbox never has to cut the note off.
	MaxSummaryBytes = belay.MaxSummaryBytes
	// MaxTranscriptBytes caps the transcript, below belay.MaxArtifactBytes
	// so that the artifact is never refused for its size.
	MaxTranscriptBytes = belay.MaxArtifactBytes - 64<<10
)

// nudge is what the loop tells a model that answered without a tool call.
const nudge = "You replied without calling a tool. Continue the task with the tools; " +
	"when the change is done, or cannot be done, call finish with a short summary."

// Run runs the agent loop until the model finishes or the run must stop,
// and reports how it ended. The returned error is non-nil only when cfg is
// unusable and nothing was sent; every run that started ends with a nil
// error and Outcome.Reason saying why it ended (the detail of a model error
// is logged and written to the transcript).
func Run(ctx context.Context, cfg Config) (Outcome, error) {
	if err := cfg.check(); err != nil {
		return Outcome{}, err
	}
	l := newLoop(cfg)
	var out Outcome
	if ended := l.resumed; ended != nil {
		out = *ended
	} else {
		out = l.run(ctx)
		if out.Reason != ReasonCancelled && out.Reason != ReasonRunInactive {
			// The loop ended for a reason of its own: a sandbox lost
			// after this (in the final checks) resumes straight to them.
			// A loop stopped from outside is resumed from its last call.
			l.checkpoint(ctx, nil, &out)
		}
	}
	l.tr.write(line{Role: "outcome", Outcome: &out})
	l.log.Info("agent loop ended", "reason", out.Reason, "finished", out.Finished, "steps", out.Steps,
		"model_requests", out.Usage.ModelRequests, "prompt_tokens", out.Usage.PromptTokens,
		"completion_tokens", out.Usage.CompletionTokens)
	return out, nil
}

func (c Config) check() error {
	switch {
	case c.BaseURL == "":
		return belay.FieldErrorf(belay.CodeInvalid, "BaseURL", "required")
	case c.Model == "":
		return belay.FieldErrorf(belay.CodeInvalid, "Model", "required")
	case c.Instruction == "":
		return belay.FieldErrorf(belay.CodeInvalid, "Instruction", "required")
	case c.MaxSteps < 1:
		return belay.FieldErrorf(belay.CodeInvalid, "MaxSteps", "must be at least 1, got %d", c.MaxSteps)
	case c.Tools == nil:
		return belay.FieldErrorf(belay.CodeInvalid, "Tools", "required")
	}
	if c.Resume != nil {
		if err := CheckResume(*c.Resume); err != nil {
			return fmt.Errorf("%w: %w", errNoResume, err)
		}
	}
	u, err := url.Parse(c.BaseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return belay.FieldErrorf(belay.CodeInvalid, "BaseURL", "must be an http(s) URL")
	}
	return nil
}

// loop is one run's state: the conversation so far and what it spent.
type loop struct {
	cfg    Config
	client openai.ChatCompletionService
	log    *slog.Logger
	events EventSink
	tr     *transcript
	redact func(string) string
	tools  []openai.ChatCompletionToolUnionParam
	// conv is the conversation, the one record of it: each model call
	// sends it (params) and each checkpoint keeps it (state).
	conv   []Message
	nudged bool
	out    Outcome
	// resumed is the outcome a resumed state had already ended with.
	resumed *Outcome
}

func newLoop(cfg Config) *loop {
	l := &loop{cfg: cfg, log: cfg.Logger, events: cfg.Events}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	if l.events == nil {
		l.events = discardEvents{}
	}
	l.redact = redactor(cfg.Token)
	l.tr = newTranscript(cfg.Transcript, l.redact, l.log)

	httpClient := cfg.HTTPClient
	if httpClient == nil {
		httpClient = http.DefaultClient
	}
	// The chat-completions service alone, not openai.NewClient: the client
	// would also pick up OPENAI_* variables from the environment (extra
	// headers, an organization), and the loop must send exactly what the
	// run configured. Retries are the loop's (see complete): the SDK's would
	// retry a 429, spending budget on an answer that cannot change.
	l.client = openai.NewChatCompletionService(
		option.WithBaseURL(cfg.BaseURL),
		option.WithAPIKey(cfg.Token),
		option.WithHTTPClient(httpClient),
		option.WithMaxRetries(0),
	)

	// finish is the loop's: its definition replaces any from Tools.
	defs := slices.Clone(cfg.Tools.Definitions())
	if i := slices.IndexFunc(defs, func(d ToolDef) bool { return d.Name == FinishTool }); i >= 0 {
		defs[i] = finishDef
	} else {
		defs = append(defs, finishDef)
	}
	if len(cfg.Skills) > 0 {
		defs = slices.DeleteFunc(defs, func(d ToolDef) bool { return d.Name == ReadSkillTool })
		defs = append(defs, readSkillDef)
	}
	for _, d := range defs {
		l.tools = append(l.tools, toolParam(d))
	}
	if cfg.Resume != nil {
		reason := cfg.InterruptedReason
		if reason == "" {
			reason = DefaultInterruptedReason
		}
		l.resumed = l.resume(*cfg.Resume, reason)
		return l
	}
	system := systemPrompt(defs, cfg.MaxSteps) + skillsPrompt(cfg.Skills)
	l.conv = []Message{{Role: "system", Content: system}}
	l.tr.write(line{Role: "system", Content: system})
	for _, m := range cfg.Conversation {
		l.conv = append(l.conv, Message{Role: m.Role, Content: m.Content})
		l.tr.write(line{Role: m.Role, Content: l.redact(m.Content)})
	}
	l.conv = append(l.conv, Message{Role: "user", Content: cfg.Instruction})
	l.tr.write(line{Role: "user", Content: cfg.Instruction})
	return l
}

func (l *loop) run(ctx context.Context) Outcome {
	for l.out.Steps < l.cfg.MaxSteps {
		if ctx.Err() != nil {
			return l.end(ReasonCancelled)
		}
		l.out.Steps++
		step := l.out.Steps
		resp, err := l.complete(ctx)
		if err != nil {
			return l.fail(ctx, step, err)
		}
		l.out.Usage.PromptTokens += resp.Usage.PromptTokens
		l.out.Usage.CompletionTokens += resp.Usage.CompletionTokens
		if len(resp.Choices) == 0 {
			return l.fail(ctx, step, errors.New("the model's answer has no choices"))
		}
		msg := resp.Choices[0].Message
		l.conv = append(l.conv, assistantMessage(msg))
		l.recordAssistant(step, msg, resp.Usage)
		l.log.Info("model answered", "step", step, "tool_calls", len(msg.ToolCalls),
			"finish_reason", resp.Choices[0].FinishReason)

		if len(msg.ToolCalls) == 0 {
			if !l.nudged {
				l.nudged = true
				l.conv = append(l.conv, Message{Role: "user", Content: nudge})
				l.tr.write(line{Role: "user", Step: step, Content: nudge})
				continue
			}
			if msg.Content == "" {
				return l.fail(ctx, step, errors.New("the model answered with neither text nor a tool call"))
			}
			l.out.Finished = true
			l.out.Summary = capSummary(l.redact(msg.Content))
			return l.end(ReasonFinished)
		}

		for i, tc := range msg.ToolCalls {
			if ctx.Err() != nil {
				return l.end(ReasonCancelled)
			}
			if l.toolCall(ctx, step, tc) {
				for _, skipped := range msg.ToolCalls[i+1:] {
					l.tr.write(line{Role: "tool", Step: step, ToolCallID: skipped.ID, Name: skipped.Function.Name,
						IsError: true, Content: "not run: finish was called first"})
				}
				return l.end(ReasonFinished)
			}
		}
	}
	return l.end(ReasonMaxSteps)
}

// complete makes one model call. A connection failure (nothing answered)
// is retried once; an HTTP answer, even an error, never is.
func (l *loop) complete(ctx context.Context) (*openai.ChatCompletion, error) {
	params := openai.ChatCompletionNewParams{
		Model:    openai.ChatModel(l.cfg.Model),
		Messages: l.params(),
		Tools:    l.tools,
	}
	for attempt := 1; ; attempt++ {
		l.out.Usage.ModelRequests++
		resp, err := l.client.New(ctx, params)
		var uerr *url.Error
		if err == nil || attempt > 1 || ctx.Err() != nil || !errors.As(err, &uerr) {
			return resp, err
		}
		l.log.Warn("model call failed to connect; retrying once", "step", l.out.Steps, "err", l.redact(err.Error()))
	}
}

// fail ends the loop after a failed model call, with the reason the error
// means.
func (l *loop) fail(ctx context.Context, step int, err error) Outcome {
	reason := ReasonModelError
	var apiErr *openai.Error
	switch {
	case ctx.Err() != nil:
		reason = ReasonCancelled
	case errors.As(err, &apiErr) && apiErr.StatusCode == http.StatusUnauthorized:
		reason = ReasonRunInactive
	case errors.As(err, &apiErr) && apiErr.StatusCode == http.StatusTooManyRequests &&
		apiErr.Code == string(belay.CodeBudgetExhausted):
		reason = ReasonBudgetExhausted
	}
	detail := l.redact(describe(err))
	if reason == ReasonModelError {
		l.log.Warn("model call failed", "step", step, "err", detail)
	} else {
		l.log.Info("model call refused", "step", step, "reason", reason, "err", detail)
	}
	l.tr.write(line{Role: "error", Step: step, Content: detail})
	return l.end(reason)
}

// describe renders a model-call error for logs and the transcript: the
// status and code of an API error (its safe summary, never the request),
// otherwise the error text.
func describe(err error) string {
	var apiErr *openai.Error
	if errors.As(err, &apiErr) {
		if apiErr.Code != "" {
			return fmt.Sprintf("%s (code %s)", apiErr.Error(), apiErr.Code)
		}
		return apiErr.Error()
	}
	return err.Error()
}

func (l *loop) end(reason string) Outcome {
	l.out.Reason = reason
	return l.out
}

func (l *loop) recordAssistant(step int, msg openai.ChatCompletionMessage, u openai.CompletionUsage) {
	ln := line{Role: "assistant", Step: step, Content: l.redact(msg.Content),
		Usage: &lineUsage{PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens}}
	for _, tc := range msg.ToolCalls {
		ln.ToolCalls = append(ln.ToolCalls, lineToolCall{ID: tc.ID, Name: l.redact(tc.Function.Name),
			Arguments: l.redact(tc.Function.Arguments)})
	}
	l.tr.write(ln)
	if msg.Content != "" {
		text, cut := truncate(l.redact(msg.Content), MaxEventTextBytes)
		l.events.Emit(belay.EventAgentMessage, messageEvent{Step: step, Text: text, Truncated: cut})
	}
}

// toolCall runs one tool call, appends its result to the conversation, and
// reports whether it was a valid finish, which ends the loop.
func (l *loop) toolCall(ctx context.Context, step int, tc openai.ChatCompletionMessageToolCallUnion) (finished bool) {
	name, rawArgs := tc.Function.Name, tc.Function.Arguments
	if tc.Type != "" && tc.Type != "function" {
		name, rawArgs = tc.Custom.Name, tc.Custom.Input
	}
	args, cut := truncate(l.redact(rawArgs), MaxEventTextBytes)
	l.events.Emit(belay.EventToolCall, callEvent{Step: step, CallID: shortID(tc.ID), Name: shortID(l.redact(name)),
		Arguments: args, ArgumentsTruncated: cut})

	var result string
	var isError bool
	switch {
	case tc.Type != "" && tc.Type != "function":
		result, isError = fmt.Sprintf("tool call type %q is not supported; call the tools as functions", tc.Type), true
	case name == FinishTool:
		summary, err := finishSummary(rawArgs)
		if err != nil {
			result, isError = err.Error(), true
			break
		}
		l.out.Finished = true
		l.out.Summary = capSummary(l.redact(summary))
		result = "finished"
		finished = true
	case name == ReadSkillTool && len(l.cfg.Skills) > 0:
		result, isError = readSkill(l.cfg.Skills, rawArgs)
	default:
		// The call is saved as pending before it runs: if the sandbox
		// is lost while it runs, the next one answers it as interrupted
		// rather than run it again.
		l.checkpoint(ctx, &PendingCall{ID: tc.ID, Name: shortID(name), Step: step, Since: time.Now().UTC()}, nil)
		result, isError = l.callTool(ctx, name, rawArgs)
	}
	result = l.redact(result)
	total := len(result)
	result = capText(result, MaxToolResultBytes)

	content := result
	if isError {
		content = "error: " + result
	}
	l.conv = append(l.conv, Message{Role: "tool", Content: content, ToolCallID: tc.ID})
	l.tr.write(line{Role: "tool", Step: step, ToolCallID: tc.ID, Name: l.redact(name), IsError: isError, Content: result})
	short, cut := truncate(result, MaxEventTextBytes)
	l.events.Emit(belay.EventToolResult, resultEvent{Step: step, CallID: shortID(tc.ID), Name: shortID(l.redact(name)),
		IsError: isError, Result: short, ResultBytes: total, ResultTruncated: cut})
	l.log.Info("tool call", "step", step, "tool", shortID(name), "is_error", isError, "result_bytes", total)
	if !finished && ctx.Err() == nil {
		// A call cut short because the loop is being stopped keeps its
		// pending checkpoint: a resume answers it as interrupted.
		l.checkpoint(ctx, nil, nil)
	}
	return finished
}

// callTool hands a call to Tools, after checking that its arguments are
// JSON. A panic in Tools (which its contract forbids) becomes an error
// result rather than the end of the run.
func (l *loop) callTool(ctx context.Context, name, rawArgs string) (result string, isError bool) {
	if strings.TrimSpace(rawArgs) == "" {
		rawArgs = "{}"
	}
	if !json.Valid([]byte(rawArgs)) {
		return "the arguments are not valid JSON; send one JSON object", true
	}
	defer func() {
		if r := recover(); r != nil {
			l.log.Error("tool panicked", "tool", shortID(name), "panic", l.redact(fmt.Sprint(r)))
			result, isError = "the tool failed unexpectedly", true
		}
	}()
	return l.cfg.Tools.Call(ctx, name, json.RawMessage(rawArgs))
}

func finishSummary(rawArgs string) (string, error) {
	var a struct {
		Summary *string `json:"summary"`
	}
	if err := json.Unmarshal([]byte(rawArgs), &a); err != nil || a.Summary == nil {
		return "", errors.New(`finish needs {"summary": "<what you changed and why>"}`)
	}
	return *a.Summary, nil
}

// finishDef is the finish tool as the model sees it.
var finishDef = ToolDef{
	Name: FinishTool,
	Description: "End the run. Call it once, as your last tool call, when the change is done " +
		"or cannot be done, with a summary for the person who asked.",
	Parameters: map[string]any{
		"type": "object",
		"properties": map[string]any{
			"summary": map[string]any{
				"type":        "string",
				"description": "What you changed and why, and what the checks showed; a few sentences.",
			},
		},
		"required":             []string{"summary"},
		"additionalProperties": false,
	},
}

func toolParam(d ToolDef) openai.ChatCompletionToolUnionParam {
	params := d.Parameters
	if params == nil {
		params = map[string]any{"type": "object", "properties": map[string]any{}}
	}
	fn := openai.FunctionDefinitionParam{Name: d.Name, Parameters: openai.FunctionParameters(params)}
	if d.Description != "" {
		fn.Description = openai.String(d.Description)
	}
	return openai.ChatCompletionFunctionTool(fn)
}

type discardEvents struct{}

func (discardEvents) Emit(string, any) {}
