package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/token"
	"github.com/belay-dev/belay/internal/upstream"
)

// Bounds of the model proxy.
const (
	// MaxChatRequestBytes caps a chat-completions body from the sandbox.
	MaxChatRequestBytes = 1 << 20
	// MaxCompletionTokens caps max_tokens and max_completion_tokens; a
	// call that sets neither gets max_completion_tokens at this value.
	MaxCompletionTokens = 4096
)

// ChatRequestKeys are the top-level keys of a chat-completions body the
// proxy accepts: what the OpenAI Go SDK sends for a tool-calling agent. Any
// other key is refused, because it could change what the call costs or where
// its data goes (for example "store", "metadata", "audio", "logit_bias",
// "prediction", "web_search_options"). "stream" is accepted and forced to
// false; "stream_options" is accepted and dropped, since it is only
// meaningful for a stream; "n" must be 1 (one answer per paid request).
var ChatRequestKeys = []string{
	"model", "messages", "tools", "tool_choice", "temperature", "top_p",
	"max_tokens", "max_completion_tokens", "stream", "stream_options", "n",
	"stop", "seed", "parallel_tool_calls", "response_format", "user",
	"frequency_penalty", "presence_penalty",
}

var chatRequestKeySet = func() map[string]bool {
	m := make(map[string]bool, len(ChatRequestKeys))
	for _, k := range ChatRequestKeys {
		m[k] = true
	}
	return m
}()

// budgetExhaustedBatch is the batch id of the one budget.exhausted event a
// run gets: the store's batch idempotency turns every later append into a
// no-op, however many calls are refused concurrently.
const budgetExhaustedBatch = "control:budget.exhausted"

// ValidateUpstreamURL checks an OpenAI-compatible provider's URL: https, a
// host, no credentials, no query, no fragment, a path ending in
// /chat/completions; plain http only with allowLoopbackHTTP and a loopback
// host. See upstream.ValidateChatURL, which it is.
func ValidateUpstreamURL(raw string, allowLoopbackHTTP bool) error {
	return upstream.ValidateChatURL(raw, allowLoopbackHTTP)
}

// IsLoopbackHost reports whether host (a URL's Hostname, without port or
// brackets) is "localhost" or a loopback IP address: the one place where
// belay lets a secret travel over plain http. The handler, the client and
// the embedded server all ask it, so they agree on what loopback is.
func IsLoopbackHost(host string) bool { return upstream.IsLoopbackHost(host) }

// chatCall is a validated chat-completions call, ready to forward.
type chatCall struct {
	body      []byte
	messages  int
	tools     int
	maxTokens int64
}

// parseChatRequest validates the sandbox's body against the token's model
// and rewrites it into the canonical body that is forwarded: only known
// keys, the model set, stream false, token caps applied. Forwarding the
// re-encoded body (never the raw bytes) means duplicate keys or odd
// spellings cannot make the upstream read something the proxy did not check.
func parseChatRequest(body []byte, model string) (chatCall, error) {
	var m map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&m); err != nil || m == nil {
		return chatCall{}, belay.Errorf(belay.CodeInvalid, "request body must be a JSON object")
	}
	if _, err := dec.Token(); err != io.EOF {
		return chatCall{}, belay.Errorf(belay.CodeInvalid, "request body has data after the JSON value")
	}
	for k := range m {
		if !chatRequestKeySet[k] {
			return chatCall{}, belay.FieldErrorf(belay.CodeInvalid, clip(k, 64), "is not an accepted chat-completions key")
		}
	}
	var call chatCall

	if raw, ok := m["model"]; ok && !isNull(raw) {
		var got string
		if err := json.Unmarshal(raw, &got); err != nil || got != model {
			return chatCall{}, belay.FieldErrorf(belay.CodeInvalid, "model", "must be %q, the run's model", model)
		}
	}
	m["model"], _ = json.Marshal(model)

	var messages []json.RawMessage
	if err := json.Unmarshal(m["messages"], &messages); err != nil || len(messages) == 0 {
		return chatCall{}, belay.FieldErrorf(belay.CodeInvalid, "messages", "must be a non-empty array of message objects")
	}
	for i, msg := range messages {
		if !isObject(msg) {
			return chatCall{}, belay.FieldErrorf(belay.CodeInvalid, fmt.Sprintf("messages[%d]", i), "must be an object")
		}
	}
	call.messages = len(messages)

	if raw, ok := m["tools"]; ok {
		if isNull(raw) {
			delete(m, "tools")
		} else {
			var tools []json.RawMessage
			if err := json.Unmarshal(raw, &tools); err != nil {
				return chatCall{}, belay.FieldErrorf(belay.CodeInvalid, "tools", "must be an array of tool objects")
			}
			call.tools = len(tools)
		}
	}

	if raw, ok := m["n"]; ok && !isNull(raw) {
		var n int
		if err := json.Unmarshal(raw, &n); err != nil || n != 1 {
			return chatCall{}, belay.FieldErrorf(belay.CodeInvalid, "n", "must be 1")
		}
	}

	if raw, ok := m["stream"]; ok && !isNull(raw) {
		var b bool
		if err := json.Unmarshal(raw, &b); err != nil {
			return chatCall{}, belay.FieldErrorf(belay.CodeInvalid, "stream", "must be a boolean")
		}
	}
	m["stream"] = json.RawMessage("false")
	delete(m, "stream_options")

	capped := false
	for _, k := range []string{"max_tokens", "max_completion_tokens"} {
		raw, ok := m[k]
		if !ok || isNull(raw) {
			delete(m, k)
			continue
		}
		var n int64
		if err := json.Unmarshal(raw, &n); err != nil || n < 1 {
			return chatCall{}, belay.FieldErrorf(belay.CodeInvalid, k, "must be a positive integer")
		}
		n = min(n, MaxCompletionTokens)
		m[k], _ = json.Marshal(n)
		call.maxTokens = max(call.maxTokens, n)
		capped = true
	}
	if !capped {
		m["max_completion_tokens"], _ = json.Marshal(MaxCompletionTokens)
		call.maxTokens = MaxCompletionTokens
	}

	out, err := json.Marshal(m)
	if err != nil {
		// A RawMessage that is not valid JSON cannot get here (the decoder
		// checked it), so this is the sandbox's malformed input at worst.
		return chatCall{}, belay.Errorf(belay.CodeInvalid, "request body is not valid JSON")
	}
	call.body = out
	return call, nil
}

func isNull(raw json.RawMessage) bool { return bytes.Equal(bytes.TrimSpace(raw), []byte("null")) }

func isObject(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) > 0 && raw[0] == '{'
}

// clip shortens s for an error message, so a hostile key cannot make the
// answer large.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// chatAnswer is what the proxy reads from the upstream's answer: enough for
// the usage count and the model.response event, never the content.
type chatAnswer struct {
	Choices []struct {
		FinishReason string `json:"finish_reason"`
		Message      struct {
			ToolCalls []struct {
				Function struct {
					Name string `json:"name"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"message"`
	} `json:"choices"`
	Usage struct {
		PromptTokens     int64 `json:"prompt_tokens"`
		CompletionTokens int64 `json:"completion_tokens"`
	} `json:"usage"`
}

// modelResponseData is the model.response event: how the call ended, which
// tools the model asked for, and what it cost, not the content.
type modelResponseData struct {
	FinishReason   string         `json:"finishReason,omitempty"`
	ToolCalls      []string       `json:"toolCalls,omitempty"`
	Usage          *responseUsage `json:"usage,omitempty"`
	Error          belay.Code     `json:"error,omitempty"`
	UpstreamStatus int            `json:"upstreamStatus,omitempty"`
}

type responseUsage struct {
	PromptTokens     int64 `json:"promptTokens"`
	CompletionTokens int64 `json:"completionTokens"`
}

// Bounds of the tool names copied into a model.response event.
const (
	maxEventToolCalls = 32
	maxEventToolName  = 64
)

// handleChatCompletions is the model proxy. Its four steps run in this
// order, and each refusal stops before the next: (1) the model token, (2)
// the body, (3) one request of the run's budget, (4) only then the provider
// key and the upstream call. A call refused in steps 1 to 3 never reaches
// the upstream and never touches the key.
func (s *Server) handleChatCompletions(w http.ResponseWriter, r *http.Request) {
	st := stateOf(r)
	// (1) The token names the run; the model must be the operator's.
	tok, ok := bearer(r)
	if !ok {
		s.writeError(w, r, belay.Errorf(belay.CodeInactiveRunToken, "missing run token"))
		return
	}
	claims, err := s.signer.Verify(tok, token.Expect{Audience: token.AudienceModel, Model: s.limits.Model})
	if err != nil {
		s.log.Info("run token refused", "request_id", st.id, "audience", string(token.AudienceModel), "err", err.Error())
		s.writeError(w, r, belay.Errorf(belay.CodeInactiveRunToken, "invalid or expired run token"))
		return
	}
	st.runID = claims.RunID

	// (2) The body.
	body, err := readBody(w, r, MaxChatRequestBytes)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	call, err := parseChatRequest(body, claims.Model)
	if err != nil {
		s.writeError(w, r, err)
		return
	}

	// (3) The budget, and the model.request event in the same write
	// (belay.ModelCallStore). From here on the call is paid for, so the
	// rest runs to the end even if the sandbox hangs up.
	ctx := context.WithoutCancel(r.Context())
	res, err := s.store.SpendModelRequest(ctx, claims.RunID, belay.ModelCall{
		Model: claims.Model, Messages: call.messages, Tools: call.tools, MaxTokens: call.maxTokens,
	}, s.now())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	switch res.Outcome {
	case belay.ConsumeOK:
	case belay.ConsumeExhausted:
		s.noteBudgetExhausted(ctx, r, claims.RunID)
		s.writeError(w, r, belay.Errorf(belay.CodeBudgetExhausted, "the run has used all its model requests"))
		return
	default:
		s.log.Info("model call refused", "request_id", st.id, "run_id", claims.RunID, "outcome", string(res.Outcome))
		s.writeError(w, r, belay.Errorf(belay.CodeInactiveRunToken, "invalid or expired run token"))
		return
	}

	// (4) Attach the key, forward. The upstream call alone also ends when
	// the server closes; what it spent is still recorded below.
	upCtx, cancelUp := s.detached(r)
	answer, status, err := s.forward(upCtx, r, call.body)
	cancelUp()
	delta := belay.UsageDelta{ModelRequests: 1}
	resp := modelResponseData{}
	if err != nil {
		resp.Error, resp.UpstreamStatus = belay.ErrorCode(err), status
	} else {
		var parsed chatAnswer
		// The answer is valid JSON (forward checked); a shape we do not
		// expect only costs us the usage figures, not the call.
		_ = json.Unmarshal(answer, &parsed)
		delta.PromptTokens = max(parsed.Usage.PromptTokens, 0)
		delta.CompletionTokens = max(parsed.Usage.CompletionTokens, 0)
		resp.Usage = &responseUsage{PromptTokens: delta.PromptTokens, CompletionTokens: delta.CompletionTokens}
		if len(parsed.Choices) > 0 {
			resp.FinishReason = clip(parsed.Choices[0].FinishReason, maxEventToolName)
			for _, tc := range parsed.Choices[0].Message.ToolCalls {
				if len(resp.ToolCalls) == maxEventToolCalls {
					break
				}
				resp.ToolCalls = append(resp.ToolCalls, clip(tc.Function.Name, maxEventToolName))
			}
		}
	}
	// The budget was spent whether or not the upstream answered, so the
	// request is counted either way, with its model.response event in the
	// same write.
	s.recordModelResponse(ctx, r, claims.RunID, delta, resp)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(answer)
}

// forward sends body through the configured provider (OpenAI-compatible,
// Anthropic or Bedrock; see internal/upstream) within the upstream timeout
// and returns its chat.completion answer. A failure is an upstream_error
// whose message names the problem and, for an HTTP error, the provider's
// status (a 429 or a 5xx is named as it is), but never the provider's body
// or the key; unavailable when the key or the AWS credentials could not be
// had; invalid when the request cannot be said in the provider's format.
// status is the provider's HTTP status when it answered. The provider sends
// the call once: it never retries what the budget paid for once.
func (s *Server) forward(ctx context.Context, r *http.Request, body []byte) (answer []byte, status int, err error) {
	st := stateOf(r)
	ctx, cancel := context.WithTimeout(ctx, s.upstream.Timeout)
	defer cancel()
	answer, err = s.provider.Complete(ctx, upstream.Call{Body: body, MaxResponseBytes: s.upstream.MaxResponseBytes})
	if err == nil {
		return answer, http.StatusOK, nil
	}
	ue := upstream.AsError(err)
	switch ue.Kind {
	case upstream.ErrKeyUnavailable:
		// The source's error names a file, a secret or the credential
		// chain, never the key: the operator's to read.
		detail := ue.Message
		if ue.Err != nil {
			detail = ue.Err.Error()
		}
		s.log.Error("model provider credential unavailable", "request_id", st.id, "run_id", st.runID, "err", detail)
		return nil, 0, belay.Errorf(belay.CodeUnavailable, "%s", ue.Message)
	case upstream.ErrInvalid:
		return nil, 0, belay.FieldErrorf(belay.CodeInvalid, ue.Field, "%s", ue.Message)
	}
	return nil, ue.Status, s.upstreamFailure(ctx, r, ue.Status, ue.Message, ue.Err)
}

// upstreamFailure logs an upstream problem (a warning: the operator may need
// to act, but it is not belay's bug) and builds the caller's upstream_error.
// The providers' details name a URL, a status, an error type or a request
// id, never headers or the answer's body, so they are safe to log; the
// caller's message gets none of them.
func (s *Server) upstreamFailure(ctx context.Context, r *http.Request, status int, msg string, err error) error {
	st := stateOf(r)
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		msg = fmt.Sprintf("the model provider did not answer within %s", s.upstream.Timeout)
	}
	attrs := []any{"request_id", st.id, "run_id", st.runID, "status", status}
	if err != nil {
		attrs = append(attrs, "err", err.Error())
	}
	s.log.Warn("model provider call failed: "+msg, attrs...)
	return belay.Errorf(belay.CodeUpstream, "%s", msg)
}

// recordModelResponse adds a call's usage and appends its model.response
// event in one write. A failure is logged and does not fail the call,
// whose answer the sandbox has paid for.
func (s *Server) recordModelResponse(ctx context.Context, r *http.Request, runID string, delta belay.UsageDelta, resp modelResponseData) {
	raw, err := json.Marshal(resp)
	if err == nil {
		_, err = s.store.RecordModelResponse(ctx, runID, delta, belay.EventInput{Time: s.now(), Type: belay.EventModelResponse, Data: raw})
	}
	if err != nil {
		s.log.Error("record model response", "request_id", stateOf(r).id, "run_id", runID, "err", err.Error())
	}
}

// noteBudgetExhausted appends the run's one budget.exhausted event. The
// budget comes from the capability, best effort: the event matters more.
func (s *Server) noteBudgetExhausted(ctx context.Context, r *http.Request, runID string) {
	data := struct {
		MaxRequests int `json:"maxRequests,omitempty"`
	}{}
	if c, err := s.store.GetCapability(ctx, runID); err == nil {
		data.MaxRequests = c.MaxRequests
	}
	s.appendControlEvent(ctx, r, runID, budgetExhaustedBatch, belay.EventBudgetExhausted, data)
}

// appendControlEvent appends one event the control plane writes about a
// run. A conflict means the run has ended meanwhile, which is fine: the
// event no longer matters. Other failures are logged and do not fail the
// call that caused the event.
func (s *Server) appendControlEvent(ctx context.Context, r *http.Request, runID, batchID, typ string, data any) {
	raw, err := json.Marshal(data)
	if err != nil {
		s.log.Error("encode event", "request_id", stateOf(r).id, "run_id", runID, "type", typ, "err", err.Error())
		return
	}
	_, err = s.store.AppendEvents(ctx, runID, batchID, []belay.EventInput{{Time: s.now(), Type: typ, Data: raw}})
	if err != nil && !belay.IsCode(err, belay.CodeConflict) {
		s.log.Error("append event", "request_id", stateOf(r).id, "run_id", runID, "type", typ, "err", err.Error())
	}
}
