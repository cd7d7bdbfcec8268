package scriptedmodel_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"

	"github.com/belay-dev/belay/internal/scriptedmodel"
)

var anthropicHeaders = map[string]string{"Anthropic-Version": "2023-06-01", "X-Api-Key": "sk-test"}

// TestAnthropicFormat drives the Messages API route: the step answered,
// the reply's shape, and the request checks the API makes.
func TestAnthropicFormat(t *testing.T) {
	srv, hs := startServer(t, loadScript(t, "failures.json"))
	url := hs.URL + "/v1/messages"
	ok := `{"model":"claude-x","max_tokens":64,"system":"sys","messages":[{"role":"user","content":"Fix it."}],
	  "tools":[{"name":"list_files","input_schema":{"type":"object"}}]}`
	r := post(t, url, []byte(ok), anthropicHeaders)
	if r.status != 200 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	var msg struct {
		Type, Role, Model string
		StopReason        string `json:"stop_reason"`
		Content           []struct {
			Type, ID, Name string
			Input          json.RawMessage
		}
		Usage struct {
			InputTokens  int64 `json:"input_tokens"`
			OutputTokens int64 `json:"output_tokens"`
		}
	}
	if err := json.Unmarshal(r.body, &msg); err != nil {
		t.Fatal(err)
	}
	if msg.Type != "message" || msg.Role != "assistant" || msg.Model != "claude-x" || msg.StopReason != "tool_use" || len(msg.Content) != 2 ||
		msg.Content[0].ID != "toolu_scripted_0_0" || msg.Content[1].ID != "toolu_scripted_0_1" || string(msg.Content[1].Input) != `{"path":"README.md"}` ||
		msg.Usage.InputTokens < 1 || msg.Usage.OutputTokens < 1 {
		t.Errorf("reply %s", r.body)
	}
	rec := srv.Requests()[0]
	if rec.Format != "anthropic" || rec.Step != 0 || rec.MaxTokens != 64 || rec.APIKey != "sk-test" ||
		len(rec.Messages) != 2 || rec.Messages[0].Role != "system" || rec.Tools[0] != "list_files" {
		t.Errorf("recorded %+v", rec)
	}

	// The answer to both calls, then the scripted 429 in the API's shape.
	turn2 := `{"model":"claude-x","max_tokens":64,"messages":[{"role":"user","content":"Fix it."},
	  {"role":"assistant","content":[{"type":"tool_use","id":"toolu_scripted_0_0","name":"list_files","input":{}},{"type":"tool_use","id":"toolu_scripted_0_1","name":"read_file","input":{}}]},
	  {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_scripted_0_0","content":"a"},{"type":"tool_result","tool_use_id":"toolu_scripted_0_1","content":[{"type":"text","text":"b"}]},{"type":"text","text":"go on"}]}]}`
	r = post(t, url, []byte(turn2), anthropicHeaders)
	var e struct {
		Type  string
		Error struct{ Type, Message string }
	}
	if r.status != 429 || json.Unmarshal(r.body, &e) != nil || e.Type != "error" || e.Error.Type != "model_request_budget_exhausted" {
		t.Errorf("scripted 429: %d %s", r.status, r.body)
	}
	if rec := srv.Requests()[1]; rec.Step != 1 || len(rec.Messages) != 5 || rec.Messages[2].ToolCallID != "toolu_scripted_0_0" || rec.Messages[4].Content != "go on" {
		t.Errorf("recorded %+v", rec)
	}

	tests := []struct {
		name    string
		body    string
		headers map[string]string
		status  int
		inMsg   string
	}{
		{"no version header", ok, map[string]string{"X-Api-Key": "k"}, 400, "anthropic-version"},
		{"no credential", ok, map[string]string{"Anthropic-Version": "2023-06-01"}, 401, "x-api-key"},
		{"no max_tokens", `{"model":"m","messages":[{"role":"user","content":"x"}]}`, anthropicHeaders, 400, "max_tokens"},
		{"assistant first", `{"model":"m","max_tokens":5,"messages":[{"role":"assistant","content":"x"}]}`, anthropicHeaders, 400, "first message"},
		{"empty text", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"text","text":""}]}]}`, anthropicHeaders, 400, "non-empty"},
		{"tool_use unanswered", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"},
			{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"f","input":{}},{"type":"tool_use","id":"t2","name":"f","input":{}}]},
			{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"r"}]}]}`, anthropicHeaders, 400, "without `tool_result`"},
		{"tool_result answering nothing", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t9","content":"r"}]}]}`,
			anthropicHeaders, 400, "unexpected `tool_use_id`"},
		{"text before a tool_result", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"},
			{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"f","input":{}}]},
			{"role":"user","content":[{"type":"text","text":"hi"},{"type":"tool_result","tool_use_id":"t1","content":"r"}]}]}`, anthropicHeaders, 400, "must come first"},
		{"schema not an object", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"}],"tools":[{"name":"f","input_schema":{"type":"array"}}]}`,
			anthropicHeaders, 400, "input_schema"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := post(t, url, []byte(tt.body), tt.headers)
			var e struct {
				Error struct{ Type, Message string }
			}
			if r.status != tt.status || json.Unmarshal(r.body, &e) != nil || !strings.Contains(e.Error.Message, tt.inMsg) {
				t.Errorf("%d %s; want %d saying %q", r.status, r.body, tt.status, tt.inMsg)
			}
		})
	}
}

var bedrockCreds = aws.Credentials{AccessKeyID: "AKIDSCRIPTED00000001", SecretAccessKey: "scripted-secret", SessionToken: "scripted-session"}

// signedPost sends body to the Converse route, signed with creds for
// region (unsigned when creds is empty).
func signedPost(tb testing.TB, url string, body []byte, creds aws.Credentials, region string, at time.Time) reply {
	tb.Helper()
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		tb.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if creds.AccessKeyID != "" {
		sum := sha256.Sum256(body)
		if err := v4.NewSigner().SignHTTP(context.Background(), creds, req, hex.EncodeToString(sum[:]), "bedrock", region, at); err != nil {
			tb.Fatal(err)
		}
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	defer res.Body.Close()
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(res.Body)
	return reply{status: res.StatusCode, header: res.Header, body: buf.Bytes()}
}

// TestBedrockFormat drives the Converse route: the SigV4 check, the
// step answered, the reply's shape, and the request checks Converse makes.
func TestBedrockFormat(t *testing.T) {
	srv, hs := startServer(t, loadScript(t, "failures.json"), scriptedmodel.WithSigV4(bedrockCreds, "eu-west-3"))
	url := hs.URL + "/model/anthropic.claude-x-v1%3A0/converse"
	ok := []byte(`{"system":[{"text":"sys"}],"messages":[{"role":"user","content":[{"text":"Fix it."}]}],"inferenceConfig":{"maxTokens":64},
	  "toolConfig":{"tools":[{"toolSpec":{"name":"list_files","inputSchema":{"json":{"type":"object"}}}}]}}`)

	now := fixedNow
	for name, send := range map[string]func() reply{
		"unsigned": func() reply { return signedPost(t, url, ok, aws.Credentials{}, "", now) },
		"other credentials": func() reply {
			return signedPost(t, url, ok, aws.Credentials{AccessKeyID: "AKIDOTHER", SecretAccessKey: "x"}, "eu-west-3", now)
		},
		"wrong secret": func() reply {
			c := bedrockCreds
			c.SecretAccessKey = "guess"
			return signedPost(t, url, ok, c, "eu-west-3", now)
		},
		"other region":    func() reply { return signedPost(t, url, ok, bedrockCreds, "us-east-1", now) },
		"signed long ago": func() reply { return signedPost(t, url, ok, bedrockCreds, "eu-west-3", now.Add(-time.Hour)) },
	} {
		t.Run(name, func(t *testing.T) {
			if r := send(); r.status != http.StatusForbidden {
				t.Errorf("status %d, want 403: %s", r.status, r.body)
			}
		})
	}
	// A body altered after signing.
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(ok))
	req.Header.Set("Content-Type", "application/json")
	sum := sha256.Sum256(ok)
	_ = v4.NewSigner().SignHTTP(context.Background(), bedrockCreds, req, hex.EncodeToString(sum[:]), "bedrock", "eu-west-3", now)
	altered := bytes.Replace(ok, []byte("Fix it."), []byte("Fix It."), 1)
	req.Body = io.NopCloser(bytes.NewReader(altered))
	if res, err := http.DefaultClient.Do(req); err != nil || res.StatusCode != http.StatusForbidden {
		t.Errorf("altered body: %v %v, want 403", res.StatusCode, err)
	}

	r := signedPost(t, url, ok, bedrockCreds, "eu-west-3", now)
	if r.status != 200 || r.header.Get("X-Amzn-Requestid") == "" {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	var out struct {
		Output struct {
			Message struct {
				Role    string
				Content []struct {
					ToolUse *struct {
						ToolUseID string `json:"toolUseId"`
						Name      string
						Input     json.RawMessage
					} `json:"toolUse"`
				}
			}
		}
		StopReason string
		Usage      struct{ InputTokens, OutputTokens, TotalTokens int64 }
	}
	if err := json.Unmarshal(r.body, &out); err != nil {
		t.Fatal(err)
	}
	c := out.Output.Message.Content
	if out.StopReason != "tool_use" || len(c) != 2 || c[0].ToolUse == nil || c[0].ToolUse.ToolUseID != "tooluse_scripted_0_0" ||
		string(c[1].ToolUse.Input) != `{"path":"README.md"}` || out.Usage.TotalTokens != out.Usage.InputTokens+out.Usage.OutputTokens {
		t.Errorf("reply %s", r.body)
	}
	var signed *scriptedmodel.Request
	for _, rec := range srv.Requests() {
		if rec.Status == 200 {
			signed = &rec
		} else if rec.SignatureError == "" {
			t.Errorf("a refused request has no signature error: %+v", rec)
		}
	}
	if signed == nil || !signed.Signed || signed.Model != "anthropic.claude-x-v1:0" || signed.MaxTokens != 64 || signed.Format != "bedrock" {
		t.Errorf("recorded %+v", signed)
	}

	tests := []struct{ name, body, inMsg string }{
		{"roles do not alternate", `{"messages":[{"role":"user","content":[{"text":"a"}]},{"role":"user","content":[{"text":"b"}]}]}`, "alternate"},
		{"blank text", `{"messages":[{"role":"user","content":[{"text":" "}]}]}`, "is blank"},
		{"toolUse unanswered", `{"messages":[{"role":"user","content":[{"text":"a"}]},
			{"role":"assistant","content":[{"toolUse":{"toolUseId":"t1","name":"f","input":{}}},{"toolUse":{"toolUseId":"t2","name":"f","input":{}}}]},
			{"role":"user","content":[{"toolResult":{"toolUseId":"t1","content":[{"text":"r"}]}}]}],
			"toolConfig":{"tools":[{"toolSpec":{"name":"f","inputSchema":{"json":{"type":"object"}}}}]}}`, "expected toolResult blocks"},
		{"tool blocks without toolConfig", `{"messages":[{"role":"user","content":[{"text":"a"}]},
			{"role":"assistant","content":[{"toolUse":{"toolUseId":"t1","name":"f","input":{}}}]},
			{"role":"user","content":[{"toolResult":{"toolUseId":"t1","content":[{"text":"r"}]}}]}]}`, "toolConfig"},
		{"blank tool result", `{"messages":[{"role":"user","content":[{"text":"a"}]},
			{"role":"assistant","content":[{"toolUse":{"toolUseId":"t1","name":"f","input":{}}}]},
			{"role":"user","content":[{"toolResult":{"toolUseId":"t1","content":[{"text":""}]}}]}],
			"toolConfig":{"tools":[{"toolSpec":{"name":"f","inputSchema":{"json":{"type":"object"}}}}]}}`, "is blank"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := signedPost(t, url, []byte(tt.body), bedrockCreds, "eu-west-3", fixedNow)
			var e struct{ Message string }
			if r.status != 400 || !strings.HasPrefix(r.header.Get("X-Amzn-Errortype"), "ValidationException") ||
				json.Unmarshal(r.body, &e) != nil || !strings.Contains(e.Message, tt.inMsg) {
				t.Errorf("%d %s %s; want 400 ValidationException saying %q", r.status, r.header.Get("X-Amzn-Errortype"), r.body, tt.inMsg)
			}
		})
	}
}
