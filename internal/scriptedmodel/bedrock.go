package scriptedmodel

import (
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"regexp"
	"slices"
	"strings"
)

// bedrockFormat is Bedrock's Converse API (POST /model/{modelId}/converse).
// The server checks a request as Converse does, so a translation Bedrock
// would refuse fails here too: a JSON body; non-empty messages, the first
// the user's, roles alternating; no blank text; every toolUse of an
// assistant turn answered by a toolResult in the next user turn, and every
// toolResult answering one; a toolConfig whenever tool blocks appear.
// Replies carry toolUse ids "tooluse_scripted_<step>_<i>". With WithSigV4
// the request's SigV4 signature is checked first (403 when it does not
// match).
var bedrockFormat = format{name: FormatBedrock, parse: parseBedrock, render: renderBedrock, writeError: writeBedrockError}

var (
	bedrockIDPattern   = regexp.MustCompile(`^[a-zA-Z0-9_-]+$`)
	bedrockNamePattern = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)
)

// bedrockModelID returns the model id of a Converse path, "" for another
// path. The id may hold "/" (an ARN), escaped on the wire.
func bedrockModelID(path string) string {
	rest, ok := strings.CutPrefix(path, "/model/")
	if !ok {
		return ""
	}
	id, ok := strings.CutSuffix(rest, "/converse")
	if !ok {
		return ""
	}
	return id
}

type converseRequest struct {
	Messages []struct {
		Role    string          `json:"role"`
		Content []converseBlock `json:"content"`
	} `json:"messages"`
	System []struct {
		Text *string `json:"text"`
	} `json:"system"`
	InferenceConfig *struct {
		MaxTokens *int64 `json:"maxTokens"`
	} `json:"inferenceConfig"`
	ToolConfig *struct {
		Tools []struct {
			ToolSpec *struct {
				Name        string `json:"name"`
				InputSchema struct {
					JSON json.RawMessage `json:"json"`
				} `json:"inputSchema"`
			} `json:"toolSpec"`
		} `json:"tools"`
	} `json:"toolConfig"`
}

type converseBlock struct {
	Text    *string `json:"text"`
	ToolUse *struct {
		ToolUseID string          `json:"toolUseId"`
		Name      string          `json:"name"`
		Input     json.RawMessage `json:"input"`
	} `json:"toolUse"`
	ToolResult *struct {
		ToolUseID string `json:"toolUseId"`
		Content   []struct {
			Text *string         `json:"text"`
			JSON json.RawMessage `json:"json"`
		} `json:"content"`
	} `json:"toolResult"`
}

func parseBedrock(r *http.Request, body []byte) (parsed, error) {
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
		return parsed{}, errors.New("the Content-Type must be application/json")
	}
	var req converseRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return parsed{}, errors.New("the body is not a Converse request")
	}
	p := parsed{model: bedrockModelID(r.URL.Path)}
	if req.InferenceConfig != nil && req.InferenceConfig.MaxTokens != nil {
		p.maxTokens = *req.InferenceConfig.MaxTokens
	}
	if req.ToolConfig != nil {
		for i, t := range req.ToolConfig.Tools {
			if t.ToolSpec == nil || !bedrockNamePattern.MatchString(t.ToolSpec.Name) {
				return p, fmt.Errorf("toolConfig.tools.%d.toolSpec.name: must match %s", i, bedrockNamePattern)
			}
			if !isObjectJSON(t.ToolSpec.InputSchema.JSON) {
				return p, fmt.Errorf("toolConfig.tools.%d.toolSpec.inputSchema.json: must be a JSON object", i)
			}
			p.tools = append(p.tools, t.ToolSpec.Name)
		}
	}
	if len(req.Messages) == 0 {
		return p, errors.New("messages: at least one message is required")
	}
	var msgs []Message
	for i, s := range req.System {
		if s.Text == nil || strings.TrimSpace(*s.Text) == "" {
			return p, fmt.Errorf("the text field in the SystemContentBlock object at system.%d is blank", i)
		}
		msgs = append(msgs, Message{Role: "system", Content: *s.Text})
	}
	usesTools := false
	seen := map[string]bool{}
	var prevToolUses []string
	for i, m := range req.Messages {
		want := "user"
		if i%2 == 1 {
			want = "assistant"
		}
		if m.Role != want {
			return p, errors.New("a conversation must start with a user message and alternate between user and assistant roles")
		}
		if len(m.Content) == 0 {
			return p, fmt.Errorf("messages.%d.content: must not be empty", i)
		}
		var toolUses, answered []string
		var msg Message
		msg.Role = m.Role
		var tail []Message
		for j, b := range m.Content {
			if n := btoi(b.Text != nil) + btoi(b.ToolUse != nil) + btoi(b.ToolResult != nil); n != 1 {
				return p, fmt.Errorf("messages.%d.content.%d: a content block must have exactly one member", i, j)
			}
			switch {
			case b.Text != nil:
				if strings.TrimSpace(*b.Text) == "" {
					return p, fmt.Errorf("the text field in the ContentBlock object at messages.%d.content.%d is blank", i, j)
				}
				msg.Content += *b.Text
			case b.ToolUse != nil:
				usesTools = true
				tu := b.ToolUse
				if m.Role != "assistant" || !bedrockIDPattern.MatchString(tu.ToolUseID) || tu.Name == "" || !isObjectJSON(tu.Input) {
					return p, fmt.Errorf("messages.%d.content.%d.toolUse: an assistant's toolUse needs a toolUseId, a name and an input object", i, j)
				}
				if seen[tu.ToolUseID] {
					return p, fmt.Errorf("messages.%d.content.%d.toolUse.toolUseId: ids must be unique", i, j)
				}
				seen[tu.ToolUseID] = true
				toolUses = append(toolUses, tu.ToolUseID)
				msg.ToolCalls = append(msg.ToolCalls, MessageToolCall{ID: tu.ToolUseID, Name: tu.Name, Arguments: compactJSON(tu.Input)})
			default:
				usesTools = true
				tr := b.ToolResult
				if m.Role != "user" || !slices.Contains(prevToolUses, tr.ToolUseID) {
					return p, fmt.Errorf("messages.%d.content.%d.toolResult: the toolUseId %q does not answer a toolUse of the previous turn", i, j, tr.ToolUseID)
				}
				var text strings.Builder
				for k, c := range tr.Content {
					switch {
					case c.Text != nil && strings.TrimSpace(*c.Text) != "":
						text.WriteString(*c.Text)
					case len(c.JSON) > 0:
						text.Write(c.JSON)
					default:
						return p, fmt.Errorf("the text field in the ToolResultContentBlock object at messages.%d.content.%d.toolResult.content.%d is blank", i, j, k)
					}
				}
				answered = append(answered, tr.ToolUseID)
				tail = append(tail, Message{Role: "tool", ToolCallID: tr.ToolUseID, Content: text.String()})
			}
		}
		if m.Role == "user" {
			if missing := without(prevToolUses, answered); len(missing) > 0 {
				return p, fmt.Errorf("expected toolResult blocks at messages.%d.content for the following Ids: %s", i, strings.Join(missing, ", "))
			}
			msgs = append(msgs, tail...)
			if msg.Content != "" {
				msgs = append(msgs, msg)
			}
		} else {
			msgs = append(msgs, msg)
		}
		prevToolUses = toolUses
	}
	if usesTools && req.ToolConfig == nil {
		return p, errors.New("the toolConfig field must be defined when using toolUse and toolResult content blocks")
	}
	p.messages = msgs
	return p, nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// renderBedrock renders step as a Converse answer.
func renderBedrock(_ *Server, rec *Request, _ []byte, step Step) ([]byte, error) {
	args, err := stepArgs(step, rec.Step)
	if err != nil {
		return nil, err
	}
	content := []map[string]any{}
	if step.Content != "" {
		content = append(content, map[string]any{"text": step.Content})
	}
	for i, tc := range step.ToolCalls {
		content = append(content, map[string]any{"toolUse": map[string]any{
			"toolUseId": fmt.Sprintf("tooluse_scripted_%d_%d", rec.Step, i), "name": tc.Name, "input": json.RawMessage(args[i]),
		}})
	}
	stop := "end_turn"
	if len(step.ToolCalls) > 0 {
		stop = "tool_use"
	}
	return json.Marshal(map[string]any{
		"output":     map[string]any{"message": map[string]any{"role": "assistant", "content": content}},
		"stopReason": stop,
		"usage": map[string]any{"inputTokens": rec.PromptTokens, "outputTokens": rec.CompletionTokens,
			"totalTokens": rec.PromptTokens + rec.CompletionTokens},
		"metrics": map[string]any{"latencyMs": 1},
	})
}

// writeBedrockError answers Bedrock's error shape: the error's name in
// X-Amzn-ErrorType (by status when code is empty) and a message.
func writeBedrockError(w http.ResponseWriter, status int, code, message string) {
	if code == "" {
		code = bedrockErrorType(status)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Amzn-Errortype", code+":http://internal.amazon.com/coral/com.amazon.bedrock/")
	w.Header().Set("X-Amzn-Requestid", "scripted-error")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"message": message})
}

func bedrockErrorType(status int) string {
	switch status {
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
		return "ValidationException"
	case http.StatusForbidden, http.StatusUnauthorized:
		return "AccessDeniedException"
	case http.StatusNotFound, http.StatusMethodNotAllowed:
		return "ResourceNotFoundException"
	case http.StatusRequestTimeout:
		return "ModelTimeoutException"
	case 424:
		return "ModelErrorException"
	case http.StatusTooManyRequests:
		return "ThrottlingException"
	case http.StatusServiceUnavailable:
		return "ServiceUnavailableException"
	}
	return "InternalServerException"
}
