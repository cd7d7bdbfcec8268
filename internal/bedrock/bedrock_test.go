package bedrock_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/bedrockruntime/types"

	"github.com/belay-dev/belay/internal/bedrock"
	"github.com/belay-dev/belay/internal/scriptedmodel"
	"github.com/belay-dev/belay/internal/upstream"
)

// Bedrock cannot run here: these tests talk to a loopback httptest server
// that checks each request as Bedrock's runtime would (the Converse path,
// a SigV4 signature it recomputes with the same credentials through
// aws-sdk-go-v2's own signer, no key of any kind) and answers what the test
// scripts.

const (
	region          = "eu-west-3"
	accessKeyID     = "AKIDBELAYTEST0000001"
	secretCanary    = "secret-access-key-canary-7c6b5a4d3e2f1a0b"
	sessionCanary   = "session-token-canary-1a2b3c4d5e6f"
	bodyCanary      = "BEDROCK-BODY-CANARY"
	bearerKeyCanary = "bedrock-api-key-canary-99887766"
)

var created = time.Date(2031, 3, 4, 5, 6, 7, 0, time.UTC)

var testCreds = aws.Credentials{AccessKeyID: accessKeyID, SecretAccessKey: secretCanary, SessionToken: sessionCanary}

const converseAnswer = `{"output":{"message":{"role":"assistant","content":[{"text":"Reading."},` +
	`{"toolUse":{"toolUseId":"tooluse_01","name":"read_file","input":{"path":"calc.py"}}}]}},` +
	`"stopReason":"tool_use","usage":{"inputTokens":11,"outputTokens":7,"totalTokens":18},"metrics":{"latencyMs":3}}`

const chatJSON = `{"model":"anthropic.claude-x-v1:0","messages":[{"role":"user","content":"Fix it."}],"max_completion_tokens":4096,` +
	`"tools":[{"type":"function","function":{"name":"read_file","parameters":{"type":"object"}}}]}`

// fakeRuntime is the loopback stand-in for Bedrock's runtime.
type fakeRuntime struct {
	srv      *httptest.Server
	calls    atomic.Int64
	mu       sync.Mutex
	requests []*http.Request
	bodies   []string
	sigErrs  []string
	respond  atomic.Pointer[http.HandlerFunc]
}

func newFakeRuntime(tb testing.TB) *fakeRuntime {
	tb.Helper()
	f := &fakeRuntime{}
	f.setResponse(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Amzn-Requestid", "req-0001")
		_, _ = io.WriteString(w, converseAnswer)
	})
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.calls.Add(1)
		body, _ := io.ReadAll(r.Body)
		err := scriptedmodel.VerifySigV4(r, body, testCreds, region, bedrock.SigningName, time.Now())
		f.mu.Lock()
		f.requests = append(f.requests, r.Clone(context.Background()))
		f.bodies = append(f.bodies, string(body))
		if err != nil {
			f.sigErrs = append(f.sigErrs, err.Error())
		}
		f.mu.Unlock()
		if err != nil {
			w.Header().Set("X-Amzn-Errortype", "InvalidSignatureException")
			w.WriteHeader(http.StatusForbidden)
			_, _ = io.WriteString(w, `{"message":"signature"}`)
			return
		}
		if r.Method != http.MethodPost || !strings.HasPrefix(r.URL.Path, "/model/") || !strings.HasSuffix(r.URL.Path, "/converse") {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		(*f.respond.Load())(w, r)
	}))
	tb.Cleanup(f.srv.Close)
	return f
}

func (f *fakeRuntime) setResponse(h http.HandlerFunc) { f.respond.Store(&h) }

func (f *fakeRuntime) seen() ([]*http.Request, []string, []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*http.Request(nil), f.requests...), append([]string(nil), f.bodies...), append([]string(nil), f.sigErrs...)
}

func newProvider(tb testing.TB, f *fakeRuntime, creds aws.CredentialsProvider) *bedrock.Provider {
	tb.Helper()
	p, err := bedrock.New(context.Background(), bedrock.Config{
		Endpoint: f.srv.URL, AllowLoopbackHTTP: true,
		AWS: &aws.Config{Region: region, Credentials: creds},
		Now: func() time.Time { return created },
	})
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

func staticCreds() aws.CredentialsProvider {
	return credentials.StaticCredentialsProvider{Value: testCreds}
}

func sameJSON(tb testing.TB, got []byte, want string) bool {
	tb.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		tb.Fatalf("got is not JSON: %v\n%s", err, got)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		tb.Fatalf("want is not JSON: %v\n%s", err, want)
	}
	return reflect.DeepEqual(g, w)
}

// TestRequestTranslation is the table of chat-completions requests and the
// Converse request each becomes, as it goes over the wire (the SDK's own
// serialisation, captured by the loopback runtime).
func TestRequestTranslation(t *testing.T) {
	tests := []struct {
		name, chat, path, want string
	}{
		{"text",
			`{"model":"amazon.nova-pro-v1:0","messages":[{"role":"system","content":"You are an agent."},{"role":"user","content":"Fix it."}],"max_completion_tokens":4096}`,
			"/model/amazon.nova-pro-v1:0/converse",
			`{"system":[{"text":"You are an agent."}],"messages":[{"role":"user","content":[{"text":"Fix it."}]}],"inferenceConfig":{"maxTokens":4096}}`},
		{"multi-turn, text parts, developer message",
			`{"model":"m","messages":[{"role":"developer","content":"Rules."},{"role":"user","content":[{"type":"text","text":"Hello, "},{"type":"text","text":"there."}]},
			  {"role":"assistant","content":"Hi."},{"role":"system","content":"More rules."},{"role":"user","content":"Again."}],"max_tokens":100}`,
			"/model/m/converse",
			`{"system":[{"text":"Rules."},{"text":"More rules."}],"inferenceConfig":{"maxTokens":100},"messages":[
			  {"role":"user","content":[{"text":"Hello, there."}]},{"role":"assistant","content":[{"text":"Hi."}]},{"role":"user","content":[{"text":"Again."}]}]}`},
		{"parallel tool calls and their results; an inference profile ARN as the model",
			`{"model":"arn:aws:bedrock:eu-west-3:123456789012:inference-profile/eu.anthropic.claude-x","max_completion_tokens":4096,"messages":[{"role":"user","content":"Read both."},
			  {"role":"assistant","content":"Reading.","refusal":null,"tool_calls":[
			    {"id":"tooluse_01","type":"function","function":{"name":"read_file","arguments":"{\"path\": \"a.py\"}"}},
			    {"id":"tooluse_02","type":"function","function":{"name":"read_file","arguments":"{\"path\":\"b.py\",\"n\":12345678901234567890,\"f\":1.5}"}}]},
			  {"role":"tool","tool_call_id":"tooluse_01","content":"A"},
			  {"role":"tool","tool_call_id":"tooluse_02","content":""}],
			  "tools":[{"type":"function","function":{"name":"read_file","description":"Read a file.","parameters":{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}}}]}`,
			"/model/arn:aws:bedrock:eu-west-3:123456789012:inference-profile/eu.anthropic.claude-x/converse",
			`{"inferenceConfig":{"maxTokens":4096},"messages":[
			  {"role":"user","content":[{"text":"Read both."}]},
			  {"role":"assistant","content":[{"text":"Reading."},
			    {"toolUse":{"toolUseId":"tooluse_01","name":"read_file","input":{"path":"a.py"}}},
			    {"toolUse":{"toolUseId":"tooluse_02","name":"read_file","input":{"path":"b.py","n":12345678901234567890,"f":1.5}}}]},
			  {"role":"user","content":[
			    {"toolResult":{"toolUseId":"tooluse_01","content":[{"text":"A"}]}},
			    {"toolResult":{"toolUseId":"tooluse_02","content":[{"text":"(empty)"}]}}]}],
			  "toolConfig":{"tools":[{"toolSpec":{"name":"read_file","description":"Read a file.","inputSchema":{"json":{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}}}}]}}`},
		{"a tool result then a user message: one turn, results first; blank text left out",
			`{"model":"m","max_tokens":50,"messages":[{"role":"user","content":"Go."},
			  {"role":"assistant","content":" ","tool_calls":[{"id":"t9","type":"function","function":{"name":"finish","arguments":""}}]},
			  {"role":"tool","tool_call_id":"t9","content":"done"},{"role":"user","content":"Call a tool."}],
			  "tools":[{"type":"function","function":{"name":"finish"}}],"tool_choice":"auto"}`,
			"/model/m/converse",
			`{"inferenceConfig":{"maxTokens":50},"messages":[
			  {"role":"user","content":[{"text":"Go."}]},
			  {"role":"assistant","content":[{"toolUse":{"toolUseId":"t9","name":"finish","input":{}}}]},
			  {"role":"user","content":[{"toolResult":{"toolUseId":"t9","content":[{"text":"done"}]}},{"text":"Call a tool."}]}],
			  "toolConfig":{"tools":[{"toolSpec":{"name":"finish","inputSchema":{"json":{"type":"object","properties":{}}}}}],"toolChoice":{"auto":{}}}}`},
		{"tool_choice required and a function; sampling, stop",
			`{"model":"m","max_tokens":300,"max_completion_tokens":200,"messages":[{"role":"user","content":"x"}],"stop":["END","STOP"],"user":"run_1",
			  "temperature":1.7,"top_p":0.5,"seed":7,"parallel_tool_calls":false,"tool_choice":"required",
			  "tools":[{"type":"function","function":{"name":"finish","parameters":{"type":"object"}}}]}`,
			"/model/m/converse",
			`{"inferenceConfig":{"maxTokens":200,"temperature":1,"topP":0.5,"stopSequences":["END","STOP"]},"messages":[{"role":"user","content":[{"text":"x"}]}],
			  "toolConfig":{"tools":[{"toolSpec":{"name":"finish","inputSchema":{"json":{"type":"object"}}}}],"toolChoice":{"any":{}}}}`},
		{"tool_choice a function",
			`{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"x"}],"tool_choice":{"type":"function","function":{"name":"finish"}},
			  "tools":[{"type":"function","function":{"name":"finish","parameters":{"type":"object"}}}]}`,
			"/model/m/converse",
			`{"inferenceConfig":{"maxTokens":10},"messages":[{"role":"user","content":[{"text":"x"}]}],
			  "toolConfig":{"tools":[{"toolSpec":{"name":"finish","inputSchema":{"json":{"type":"object"}}}}],"toolChoice":{"tool":{"name":"finish"}}}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeRuntime(t)
			p := newProvider(t, f, staticCreds())
			if _, err := p.Complete(context.Background(), upstream.Call{Body: []byte(tt.chat)}); err != nil {
				t.Fatalf("Complete: %v", err)
			}
			reqs, bodies, sigErrs := f.seen()
			if len(sigErrs) > 0 {
				t.Fatalf("signature: %v", sigErrs)
			}
			if reqs[0].URL.Path != tt.path {
				t.Errorf("path %q, want %q", reqs[0].URL.Path, tt.path)
			}
			if !sameJSON(t, []byte(bodies[0]), tt.want) {
				t.Errorf("Converse request\n got %s\nwant %s", bodies[0], tt.want)
			}
		})
	}
}

func TestRequestRefusals(t *testing.T) {
	tests := []struct{ name, chat, field string }{
		{"tool_choice none", `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],"tool_choice":"none",
			"tools":[{"type":"function","function":{"name":"f"}}]}`, "tool_choice"},
		{"image part", `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://x"}}]}]}`, "messages[0].content[0].type"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			chat, err := upstream.ParseChatRequest([]byte(tt.chat))
			if err == nil {
				_, err = bedrock.Request(chat)
			}
			var ue *upstream.Error
			if !errors.As(err, &ue) || ue.Kind != upstream.ErrInvalid || ue.Field != tt.field {
				t.Fatalf("err = %#v, want ErrInvalid on %s", err, tt.field)
			}
		})
	}
}

// TestCompletionTranslation is the table of Converse answers and the
// chat.completion each becomes (what the sandbox reads).
func TestCompletionTranslation(t *testing.T) {
	usage := `"usage":{"inputTokens":11,"outputTokens":7,"totalTokens":18}`
	chatUsage := `"usage":{"prompt_tokens":11,"completion_tokens":7,"total_tokens":18}`
	head := `"id":"chatcmpl-bedrock-req-0001","object":"chat.completion","created":1930367167,"model":"m",`
	tests := []struct{ name, answer, want string }{
		{"text, end_turn",
			`{"output":{"message":{"role":"assistant","content":[{"text":"Done."}]}},"stopReason":"end_turn",` + usage + `}`,
			`{` + head + `"choices":[{"index":0,"message":{"role":"assistant","content":"Done.","refusal":null},"logprobs":null,"finish_reason":"stop"}],` + chatUsage + `}`},
		{"parallel tool calls, ids kept",
			`{"output":{"message":{"role":"assistant","content":[{"text":"Reading "},{"text":"both."},
			   {"toolUse":{"toolUseId":"tooluse_A","name":"read_file","input":{"path":"a.py"}}},
			   {"toolUse":{"toolUseId":"tooluse_B","name":"read_file","input":{"path":"b.py","n":12345678901234567890}}}]}},"stopReason":"tool_use",` + usage + `}`,
			`{` + head + `"choices":[{"index":0,"message":{"role":"assistant","content":"Reading both.","refusal":null,"tool_calls":[
			   {"id":"tooluse_A","type":"function","function":{"name":"read_file","arguments":"{\"path\":\"a.py\"}"}},
			   {"id":"tooluse_B","type":"function","function":{"name":"read_file","arguments":"{\"n\":12345678901234567890,\"path\":\"b.py\"}"}}]},
			   "logprobs":null,"finish_reason":"tool_calls"}],` + chatUsage + `}`},
		{"tool call without text, empty input; reasoning left out",
			`{"output":{"message":{"role":"assistant","content":[{"reasoningContent":{"reasoningText":{"text":"hmm"}}},{"toolUse":{"toolUseId":"tooluse_C","name":"list_files","input":{}}}]}},"stopReason":"tool_use",` + usage + `}`,
			`{` + head + `"choices":[{"index":0,"message":{"role":"assistant","content":null,"refusal":null,"tool_calls":[
			   {"id":"tooluse_C","type":"function","function":{"name":"list_files","arguments":"{}"}}]},"logprobs":null,"finish_reason":"tool_calls"}],` + chatUsage + `}`},
		{"max_tokens → length; cached input counted",
			`{"output":{"message":{"role":"assistant","content":[{"text":"Trunc"}]}},"stopReason":"max_tokens",
			  "usage":{"inputTokens":5,"outputTokens":7,"totalTokens":12,"cacheReadInputTokens":4,"cacheWriteInputTokens":2}}`,
			`{` + head + `"choices":[{"index":0,"message":{"role":"assistant","content":"Trunc","refusal":null},"logprobs":null,"finish_reason":"length"}],` + chatUsage + `}`},
		{"guardrail → content_filter",
			`{"output":{"message":{"role":"assistant","content":[{"text":"Blocked."}]}},"stopReason":"guardrail_intervened",` + usage + `}`,
			`{` + head + `"choices":[{"index":0,"message":{"role":"assistant","content":"Blocked.","refusal":null},"logprobs":null,"finish_reason":"content_filter"}],` + chatUsage + `}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeRuntime(t)
			answer := tt.answer
			f.setResponse(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.Header().Set("X-Amzn-Requestid", "req-0001")
				_, _ = io.WriteString(w, answer)
			})
			p := newProvider(t, f, staticCreds())
			got, err := p.Complete(context.Background(), upstream.Call{Body: []byte(`{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":9}`)})
			if err != nil {
				t.Fatalf("Complete: %v", err)
			}
			if !sameJSON(t, got, tt.want) {
				t.Errorf("chat completion\n got %s\nwant %s", got, tt.want)
			}
		})
	}
}

func TestFinishReasons(t *testing.T) {
	for reason, want := range map[string]string{
		"end_turn": "stop", "stop_sequence": "stop", "tool_use": "tool_calls", "max_tokens": "length",
		"model_context_window_exceeded": "length", "guardrail_intervened": "content_filter", "content_filtered": "content_filter",
		"malformed_model_output": "stop", "malformed_tool_use": "stop", "a_reason_from_the_future": "stop",
	} {
		if got := bedrock.FinishReason(types.StopReason(reason)); got != want {
			t.Errorf("FinishReason(%q) = %q, want %q", reason, got, want)
		}
	}
}

// isolateAWSEnv points the default AWS configuration at the environment
// only: no shared files, no instance metadata.
func isolateAWSEnv(t *testing.T) {
	t.Helper()
	dir := t.TempDir()
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(dir, "config"))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(dir, "credentials"))
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	t.Setenv("AWS_PROFILE", "")
	t.Setenv("AWS_ACCESS_KEY_ID", accessKeyID)
	t.Setenv("AWS_SECRET_ACCESS_KEY", secretCanary)
	t.Setenv("AWS_SESSION_TOKEN", sessionCanary)
	t.Setenv("AWS_REGION", region)
}

// TestSignedByTheCredentialChainWithNoKey: with the default AWS
// configuration (here, the environment's credentials), every call is
// SigV4-signed by them and carries no key: not the Bedrock API key in
// AWS_BEARER_TOKEN_BEDROCK, nor the secret itself.
func TestSignedByTheCredentialChainWithNoKey(t *testing.T) {
	isolateAWSEnv(t)
	t.Setenv("AWS_BEARER_TOKEN_BEDROCK", bearerKeyCanary)
	f := newFakeRuntime(t)
	p, err := bedrock.New(context.Background(), bedrock.Config{Endpoint: f.srv.URL, AllowLoopbackHTTP: true})
	if err != nil {
		t.Fatal(err)
	}
	if p.Region() != region {
		t.Errorf("region %q, want %q from AWS_REGION", p.Region(), region)
	}
	answer, err := p.Complete(context.Background(), upstream.Call{Body: []byte(chatJSON)})
	if err != nil {
		t.Fatalf("Complete: %v", err)
	}
	reqs, bodies, sigErrs := f.seen()
	if len(reqs) != 1 || len(sigErrs) != 0 {
		t.Fatalf("%d calls, signature errors %v; want 1 call, signed", len(reqs), sigErrs)
	}
	r := reqs[0]
	if !strings.HasPrefix(r.Header.Get("Authorization"), "AWS4-HMAC-SHA256 Credential="+accessKeyID+"/") {
		t.Errorf("Authorization %q is not a SigV4 signature by the configured key id", r.Header.Get("Authorization"))
	}
	var wire strings.Builder
	_ = r.Header.Write(&wire)
	wire.WriteString(bodies[0])
	for what, secret := range map[string]string{"secret access key": secretCanary, "Bedrock API key": bearerKeyCanary} {
		if strings.Contains(wire.String(), secret) || strings.Contains(string(answer), secret) {
			t.Errorf("the %s went over the wire or into the answer", what)
		}
	}
	if r.Header.Get("X-Api-Key") != "" {
		t.Error("the request carries an X-Api-Key")
	}
}

// TestProviderErrors maps each way Bedrock can fail to the proxy's error,
// after exactly one call, even with AWS_MAX_ATTEMPTS asking for more.
func TestProviderErrors(t *testing.T) {
	isolateAWSEnv(t)
	t.Setenv("AWS_MAX_ATTEMPTS", "5")
	t.Setenv("AWS_RETRY_MODE", "standard")
	awsError := func(status int, code string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("X-Amzn-Errortype", code+":http://internal.amazon.com/coral/com.amazon.bedrock/")
			w.Header().Set("X-Amzn-Requestid", "req-err")
			w.WriteHeader(status)
			_, _ = io.WriteString(w, `{"message":"`+bodyCanary+` `+r.Header.Get("Authorization")+`"}`)
		}
	}
	tests := []struct {
		name    string
		respond http.HandlerFunc
		limit   int64
		timeout time.Duration
		kind    upstream.ErrorKind
		status  int
		inMsg   string
	}{
		{"validation", awsError(400, "ValidationException"), 0, 0, upstream.ErrStatus, 400, "HTTP 400"},
		{"access denied", awsError(403, "AccessDeniedException"), 0, 0, upstream.ErrStatus, 403, "HTTP 403"},
		{"throttled", awsError(429, "ThrottlingException"), 0, 0, upstream.ErrStatus, 429, "HTTP 429"},
		{"model not ready", awsError(429, "ModelNotReadyException"), 0, 0, upstream.ErrStatus, 429, "HTTP 429"},
		{"internal", awsError(500, "InternalServerException"), 0, 0, upstream.ErrStatus, 500, "HTTP 500"},
		{"unavailable", awsError(503, "ServiceUnavailableException"), 0, 0, upstream.ErrStatus, 503, "HTTP 503"},
		{"redirect", func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "http://127.0.0.1:1/steal", http.StatusTemporaryRedirect)
		}, 0, 0, upstream.ErrStatus, 307, "HTTP 307"},
		{"not JSON", func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.WriteString(w, `<html>`+bodyCanary+`</html>`)
		}, 0, 0, upstream.ErrMalformed, 200, "not a JSON object"},
		{"no output message", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"stopReason":"end_turn","usage":{"inputTokens":1,"outputTokens":1,"totalTokens":2},"note":"`+bodyCanary+`"}`)
		}, 0, 0, upstream.ErrMalformed, 200, "could not be read"},
		{"too large", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"output":{"message":{"role":"assistant","content":[{"text":"`+strings.Repeat("x", 70<<10)+bodyCanary+`"}]}},"stopReason":"end_turn"}`)
		}, 64 << 10, 0, upstream.ErrTooLarge, 200, "larger than 65536 bytes"},
		{"no answer in time", func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() },
			0, 200 * time.Millisecond, upstream.ErrUnreachable, 0, "could not reach"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeRuntime(t)
			f.setResponse(tt.respond)
			p, err := bedrock.New(context.Background(), bedrock.Config{Endpoint: f.srv.URL, AllowLoopbackHTTP: true})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if tt.timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tt.timeout)
				defer cancel()
			}
			_, err = p.Complete(ctx, upstream.Call{Body: []byte(chatJSON), MaxResponseBytes: tt.limit})
			var ue *upstream.Error
			if !errors.As(err, &ue) {
				t.Fatalf("err = %v, want an *upstream.Error", err)
			}
			if ue.Kind != tt.kind || ue.Status != tt.status || !strings.Contains(ue.Message, tt.inMsg) {
				t.Errorf("error kind %d status %d %q; want kind %d status %d, saying %q", ue.Kind, ue.Status, ue.Message, tt.kind, tt.status, tt.inMsg)
			}
			if n := f.calls.Load(); n != 1 {
				t.Errorf("Bedrock was called %d times, want exactly 1 (no retries)", n)
			}
			if strings.Contains(err.Error(), bodyCanary) || strings.Contains(err.Error(), secretCanary) {
				t.Errorf("the error repeats Bedrock's body or the secret: %v", err)
			}
		})
	}
}

func TestNoCredentialsNoCall(t *testing.T) {
	f := newFakeRuntime(t)
	for name, creds := range map[string]aws.CredentialsProvider{
		"chain fails": aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{}, errors.New("no EC2 IMDS role found")
		}),
		"anonymous": aws.AnonymousCredentials{},
		"none":      nil,
	} {
		t.Run(name, func(t *testing.T) {
			p := newProvider(t, f, creds)
			_, err := p.Complete(context.Background(), upstream.Call{Body: []byte(chatJSON)})
			var ue *upstream.Error
			if !errors.As(err, &ue) || ue.Kind != upstream.ErrKeyUnavailable || !strings.Contains(ue.Message, "AWS credentials") {
				t.Fatalf("err = %v, want ErrKeyUnavailable naming the AWS credentials", err)
			}
		})
	}
	if f.calls.Load() != 0 {
		t.Error("Bedrock was called without credentials")
	}
}

func TestNewNeedsARegionAndAGoodEndpoint(t *testing.T) {
	if _, err := bedrock.New(context.Background(), bedrock.Config{AWS: &aws.Config{Credentials: staticCreds()}}); err == nil {
		t.Error("New accepted no region")
	}
	for _, e := range []string{"http://bedrock.example.com", "https://u:p@bedrock.example.com", "https://bedrock.example.com?x"} {
		if _, err := bedrock.New(context.Background(), bedrock.Config{Endpoint: e, AWS: &aws.Config{Region: region}}); err == nil {
			t.Errorf("New accepted endpoint %q", e)
		}
	}
}
