package scriptedmodel

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// The wire formats the server speaks.
const (
	FormatOpenAI    = "openai"
	FormatAnthropic = "anthropic"
	FormatBedrock   = "bedrock"
)

// format is one provider's wire format: how to read a request (checking it
// as the provider would), render a step as its answer, and write an error.
type format struct {
	name       string
	parse      func(r *http.Request, body []byte) (parsed, error)
	render     func(s *Server, rec *Request, body []byte, step Step) ([]byte, error)
	writeError func(w http.ResponseWriter, status int, code, message string)
}

// parsed is what every format's request says, in one shape.
type parsed struct {
	model     string
	maxTokens int64
	tools     []string
	messages  []Message
}

// formatFor picks the format a request path names.
func formatFor(path string) (format, bool) {
	switch {
	case strings.HasSuffix(path, "/chat/completions"):
		return openaiFormat, true
	case path == "/v1/messages" || strings.HasSuffix(path, "/v1/messages"):
		return anthropicFormat, true
	case bedrockModelID(path) != "":
		return bedrockFormat, true
	}
	return format{}, false
}

// stepArgs returns each tool call's arguments as compact JSON ("{}" when
// empty).
func stepArgs(step Step, stepIndex int) ([]string, error) {
	out := make([]string, len(step.ToolCalls))
	for i, tc := range step.ToolCalls {
		out[i] = "{}"
		if len(tc.Arguments) == 0 {
			continue
		}
		var buf bytes.Buffer
		if err := json.Compact(&buf, tc.Arguments); err != nil {
			return nil, fmt.Errorf("step %d tool call %d: arguments are not JSON: %w", stepIndex, i, err)
		}
		out[i] = buf.String()
	}
	return out, nil
}

// completionBytes is the size the usage's completion tokens are counted
// from: the text and each call's name and arguments.
func completionBytes(step Step) int {
	n := len(step.Content)
	args, _ := stepArgs(step, 0)
	for i, tc := range step.ToolCalls {
		n += len(tc.Name)
		if i < len(args) {
			n += len(args[i])
		}
	}
	return n
}

func shortHash(body []byte) string {
	sum := sha256.Sum256(body)
	return hex.EncodeToString(sum[:8])
}
