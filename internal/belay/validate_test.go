package belay_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/belay-dev/belay/internal/belay"
)

const testModel = "test-model-1"

// Canaries stand in for secrets a caller might put in an instruction or a
// file. No error message may carry them.
const (
	canaryInstruction = "CANARY-INSTRUCTION-5b1f0e"
	canaryContent     = "CANARY-CONTENT-93ad27"
)

func testLimits() belay.Limits { return belay.DefaultLimits(testModel) }

// baseRequest is a valid request body as a generic JSON value, for cases to
// mutate. Both canaries are in it.
func baseRequest() map[string]any {
	return map[string]any{
		"instruction": "Fix the failing test in calc.py. " + canaryInstruction,
		"files": []any{
			map[string]any{"path": "calc.py", "content": "def add(a, b):\n    return a - b  # " + canaryContent + "\n"},
			map[string]any{"path": "tests/test_calc.py", "content": "from calc import add\n\ndef test_add():\n    assert add(2, 3) == 5\n"},
		},
		"allowedPaths": []any{"calc.py", "tests/**"},
		"checks":       []any{[]any{"python3", "-m", "pytest", "-q"}},
	}
}

func marshal(tb testing.TB, v any) []byte {
	tb.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		tb.Fatalf("marshal test body: %v", err)
	}
	return b
}

// with returns a body builder: baseRequest changed by mutate.
func with(mutate func(m map[string]any)) func(testing.TB) []byte {
	return func(tb testing.TB) []byte {
		tb.Helper()
		m := baseRequest()
		mutate(m)
		return marshal(tb, m)
	}
}

// raw returns a body builder for a literal body.
func raw(s string) func(testing.TB) []byte {
	return func(testing.TB) []byte { return []byte(s) }
}

// withFiles replaces the files and points allowedPaths at the first one.
func withFiles(files ...any) func(testing.TB) []byte {
	return with(func(m map[string]any) {
		m["files"] = files
		if f, ok := files[0].(map[string]any); ok {
			if p, ok := f["path"].(string); ok && belay.CheckPath(p) == nil {
				m["allowedPaths"] = []any{p}
			}
		}
	})
}

func file(path string, size int) map[string]any {
	return map[string]any{"path": path, "content": strings.Repeat("a", size)}
}

func filePath(path string) map[string]any {
	return map[string]any{"path": path, "content": "x = 1\n"}
}

// numberedFiles returns n small files f0.py … f(n-1).py.
func numberedFiles(n int) []any {
	files := make([]any, n)
	for i := range files {
		files[i] = filePath(fmt.Sprintf("f%d.py", i))
	}
	return files
}

func assertError(tb testing.TB, err error, code belay.Code, field string) {
	tb.Helper()
	if err == nil {
		tb.Fatalf("accepted; want %s error on field %q", code, field)
	}
	var e *belay.Error
	if !errors.As(err, &e) {
		tb.Fatalf("error %v is %T, not *belay.Error", err, err)
	}
	if e.Code != code || e.Field != field {
		tb.Fatalf("error code %q field %q (%v); want code %q field %q", e.Code, e.Field, err, code, field)
	}
	if e.Message == "" {
		tb.Fatalf("error %v has no message", err)
	}
	for _, canary := range []string{canaryInstruction, canaryContent} {
		if strings.Contains(err.Error(), canary) {
			tb.Fatalf("error message echoes request text %q: %v", canary, err)
		}
	}
}

func TestParseRunRequestRejects(t *testing.T) {
	withGoTest := testLimits()
	withGoTest.AllowedChecks = append(withGoTest.AllowedChecks, []string{"go", "test", "./..."})

	tests := []struct {
		name   string
		body   func(testing.TB) []byte
		limits *belay.Limits
		code   belay.Code
		field  string
	}{
		// Path shapes.
		{"absolute path", withFiles(filePath("/etc/calc.py")), nil, belay.CodeInvalid, "files[0].path"},
		{"dotdot at start", withFiles(filePath("../calc.py")), nil, belay.CodeInvalid, "files[0].path"},
		{"dotdot in middle", withFiles(filePath("a/../calc.py")), nil, belay.CodeInvalid, "files[0].path"},
		{"dotdot at end", withFiles(filePath("calc.py"), filePath("a/..")), nil, belay.CodeInvalid, "files[1].path"},
		{"dotdot alone", withFiles(filePath("..")), nil, belay.CodeInvalid, "files[0].path"},
		{".git first segment", withFiles(filePath(".git/config.py")), nil, belay.CodeInvalid, "files[0].path"},
		{".git middle segment", withFiles(filePath("a/.git/hooks.py")), nil, belay.CodeInvalid, "files[0].path"},
		{".git last segment", withFiles(filePath("calc.py"), filePath("a/.git")), nil, belay.CodeInvalid, "files[1].path"},
		{".GIT upper case", withFiles(filePath(".GIT/x.py")), nil, belay.CodeInvalid, "files[0].path"},
		{".Git mixed case", withFiles(filePath("sub/.Git/x.py")), nil, belay.CodeInvalid, "files[0].path"},
		{"backslash", withFiles(filePath(`a\calc.py`)), nil, belay.CodeInvalid, "files[0].path"},
		{"windows path", withFiles(filePath(`C:\calc.py`)), nil, belay.CodeInvalid, "files[0].path"},
		{"NUL in path", withFiles(filePath("calc\x00.py")), nil, belay.CodeInvalid, "files[0].path"},
		{"control character in path", withFiles(filePath("calc\x1b[2J.py")), nil, belay.CodeInvalid, "files[0].path"},
		{"dot segment", withFiles(filePath("./calc.py")), nil, belay.CodeInvalid, "files[0].path"},
		{"double slash", withFiles(filePath("a//calc.py")), nil, belay.CodeInvalid, "files[0].path"},
		{"trailing slash", withFiles(filePath("calc.py"), filePath("a/")), nil, belay.CodeInvalid, "files[1].path"},
		{"empty path", withFiles(filePath("")), nil, belay.CodeInvalid, "files[0].path"},
		{"segment over 255 bytes", withFiles(filePath(strings.Repeat("a", 253) + ".py")), nil, belay.CodeInvalid, "files[0].path"},
		{"disallowed extension", withFiles(filePath("calc.py"), filePath("tool.exe")), nil, belay.CodeInvalid, "files[1].path"},
		{"no extension, unlisted name", withFiles(filePath("calc")), nil, belay.CodeInvalid, "files[0].path"},
		{"dotfile", withFiles(filePath(".env")), nil, belay.CodeInvalid, "files[0].path"},
		{"duplicate path", withFiles(filePath("calc.py"), filePath("calc.py")), nil, belay.CodeInvalid, "files[1].path"},
		{"file then directory of it", withFiles(filePath("a.py"), filePath("a.py/b.py")), nil, belay.CodeInvalid, "files[1].path"},
		{"directory then file of its name", withFiles(filePath("a.py/b.py"), filePath("a.py")), nil, belay.CodeInvalid, "files[1].path"},

		// Instruction.
		{"NUL in instruction", with(func(m map[string]any) { m["instruction"] = canaryInstruction + "\x00rest" }), nil, belay.CodeInvalid, "instruction"},
		{"empty instruction", with(func(m map[string]any) { m["instruction"] = "" }), nil, belay.CodeInvalid, "instruction"},
		{"blank instruction", with(func(m map[string]any) { m["instruction"] = " \n\t" }), nil, belay.CodeInvalid, "instruction"},
		{"absent instruction", with(func(m map[string]any) { delete(m, "instruction") }), nil, belay.CodeInvalid, "instruction"},
		{"instruction of 32001 characters", with(func(m map[string]any) { m["instruction"] = strings.Repeat("é", 32001) }), nil, belay.CodeInvalid, "instruction"},

		// Counts and sizes.
		{"33 files", withFiles(numberedFiles(33)...), nil, belay.CodeInvalid, "files"},
		{"no files", with(func(m map[string]any) { m["files"] = []any{} }), nil, belay.CodeInvalid, "files"},
		{"absent files", with(func(m map[string]any) { delete(m, "files") }), nil, belay.CodeInvalid, "files"},
		{"file of 64 KiB + 1", withFiles(file("calc.py", 64<<10), file("big.py", 64<<10+1)), nil, belay.CodeTooLarge, "files[1].content"},
		{"tree of 512 KiB + 1", withFiles(
			file("f0.py", 65535), file("f1.py", 65535), file("f2.py", 65535), file("f3.py", 65535),
			file("f4.py", 65535), file("f5.py", 65535), file("f6.py", 65535), file("f7.py", 65535),
			file("f8.py", 9)), nil, belay.CodeTooLarge, "files"},
		{"body over 768 KiB", func(tb testing.TB) []byte {
			b := marshal(tb, baseRequest())
			return append(b, strings.Repeat(" ", 768<<10+1-len(b))...)
		}, nil, belay.CodeTooLarge, ""},
		{"NUL in content", withFiles(map[string]any{"path": "calc.py", "content": canaryContent + "\x00"}), nil, belay.CodeInvalid, "files[0].content"},
		{"missing content", withFiles(map[string]any{"path": "calc.py"}), nil, belay.CodeInvalid, "files[0].content"},
		{"missing path", withFiles(map[string]any{"content": "x"}), nil, belay.CodeInvalid, "files[0].path"},

		// allowedPaths.
		{"allowedPath binds to nothing", with(func(m map[string]any) { m["allowedPaths"] = []any{"calc.py", "other.py"} }), nil, belay.CodeInvalid, "allowedPaths[1]"},
		{"allowedPath subtree binds to nothing", with(func(m map[string]any) { m["allowedPaths"] = []any{"src/**"} }), nil, belay.CodeInvalid, "allowedPaths[0]"},
		{"allowedPath names a directory", with(func(m map[string]any) { m["allowedPaths"] = []any{"tests"} }), nil, belay.CodeInvalid, "allowedPaths[0]"},
		{"allowedPath prefix is not a directory", with(func(m map[string]any) { m["allowedPaths"] = []any{"test/**"} }), nil, belay.CodeInvalid, "allowedPaths[0]"},
		{"allowedPath ** alone", with(func(m map[string]any) { m["allowedPaths"] = []any{"**"} }), nil, belay.CodeInvalid, "allowedPaths[0]"},
		{"allowedPath glob", with(func(m map[string]any) { m["allowedPaths"] = []any{"tests/*.py"} }), nil, belay.CodeInvalid, "allowedPaths[0]"},
		{"allowedPath nested **", with(func(m map[string]any) { m["allowedPaths"] = []any{"tests/**/x.py"} }), nil, belay.CodeInvalid, "allowedPaths[0]"},
		{"allowedPath with dotdot", with(func(m map[string]any) { m["allowedPaths"] = []any{"tests/../calc.py"} }), nil, belay.CodeInvalid, "allowedPaths[0]"},
		{"allowedPath absolute", with(func(m map[string]any) { m["allowedPaths"] = []any{"/calc.py"} }), nil, belay.CodeInvalid, "allowedPaths[0]"},
		{"allowedPath .git subtree", with(func(m map[string]any) { m["allowedPaths"] = []any{".git/**"} }), nil, belay.CodeInvalid, "allowedPaths[0]"},
		{"allowedPath duplicate", with(func(m map[string]any) { m["allowedPaths"] = []any{"calc.py", "calc.py"} }), nil, belay.CodeInvalid, "allowedPaths[1]"},
		{"allowedPaths empty", with(func(m map[string]any) { m["allowedPaths"] = []any{} }), nil, belay.CodeInvalid, "allowedPaths"},

		// Checks.
		{"check differs by one argument", with(func(m map[string]any) { m["checks"] = []any{[]any{"python3", "-m", "pytest", "-x"}} }), nil, belay.CodeInvalid, "checks[0]"},
		{"check with one extra argument", with(func(m map[string]any) {
			m["checks"] = []any{[]any{"git", "diff", "--check"}, []any{"python3", "-m", "pytest", "-q", "--pdb"}}
		}), nil, belay.CodeInvalid, "checks[1]"},
		{"check as one shell string", with(func(m map[string]any) { m["checks"] = []any{[]any{"python3 -m pytest -q"}} }), nil, belay.CodeInvalid, "checks[0]"},
		{"check as a bare string", with(func(m map[string]any) { m["checks"] = []any{"python3 -m pytest -q"} }), nil, belay.CodeInvalid, "checks[0]"},
		{"check argument not a string", with(func(m map[string]any) { m["checks"] = []any{[]any{"python3", 1}} }), nil, belay.CodeInvalid, "checks[0][1]"},
		{"operator check not configured", with(func(m map[string]any) { m["checks"] = []any{[]any{"go", "test", "./..."}} }), nil, belay.CodeInvalid, "checks[0]"},
		{"five checks", with(func(m map[string]any) {
			m["checks"] = []any{[]any{"git", "diff", "--check"}, []any{"python3", "-m", "pytest", "-q"},
				[]any{"python3", "-m", "compileall", "-q", "."}, []any{"python3", "-m", "unittest", "discover"},
				[]any{"go", "test", "./..."}}
		}), &withGoTest, belay.CodeInvalid, "checks"},
		{"no checks", with(func(m map[string]any) { m["checks"] = []any{} }), nil, belay.CodeInvalid, "checks"},
		{"duplicate check", with(func(m map[string]any) {
			m["checks"] = []any{[]any{"git", "diff", "--check"}, []any{"git", "diff", "--check"}}
		}), nil, belay.CodeInvalid, "checks[1]"},

		// Numbers.
		{"maxSteps 0", with(func(m map[string]any) { m["maxSteps"] = 0 }), nil, belay.CodeInvalid, "maxSteps"},
		{"maxSteps 21", with(func(m map[string]any) { m["maxSteps"] = 21 }), nil, belay.CodeInvalid, "maxSteps"},
		{"maxSteps negative", with(func(m map[string]any) { m["maxSteps"] = -1 }), nil, belay.CodeInvalid, "maxSteps"},
		{"wallTimeSeconds 0", with(func(m map[string]any) { m["wallTimeSeconds"] = 0 }), nil, belay.CodeInvalid, "wallTimeSeconds"},
		{"wallTimeSeconds 221", with(func(m map[string]any) { m["wallTimeSeconds"] = 221 }), nil, belay.CodeInvalid, "wallTimeSeconds"},
		{"maxSteps as string", with(func(m map[string]any) { m["maxSteps"] = "12" }), nil, belay.CodeInvalid, "maxSteps"},
		{"maxSteps fractional", with(func(m map[string]any) { m["maxSteps"] = json.RawMessage("12.5") }), nil, belay.CodeInvalid, "maxSteps"},
		{"maxSteps integral fraction", with(func(m map[string]any) { m["maxSteps"] = json.RawMessage("12.0") }), nil, belay.CodeInvalid, "maxSteps"},
		{"maxSteps exponent", with(func(m map[string]any) { m["maxSteps"] = json.RawMessage("1e1") }), nil, belay.CodeInvalid, "maxSteps"},
		{"maxSteps huge", with(func(m map[string]any) { m["maxSteps"] = json.RawMessage("123456789012345678901234567890") }), nil, belay.CodeInvalid, "maxSteps"},
		{"maxSteps null", with(func(m map[string]any) { m["maxSteps"] = nil }), nil, belay.CodeInvalid, "maxSteps"},
		{"maxSteps boolean", with(func(m map[string]any) { m["maxSteps"] = true }), nil, belay.CodeInvalid, "maxSteps"},
		{"wallTimeSeconds as string", with(func(m map[string]any) { m["wallTimeSeconds"] = "180" }), nil, belay.CodeInvalid, "wallTimeSeconds"},
		{"wallTimeSeconds fractional", with(func(m map[string]any) { m["wallTimeSeconds"] = 1.5 }), nil, belay.CodeInvalid, "wallTimeSeconds"},
		{"approval timeout fractional", with(func(m map[string]any) {
			m["approval"] = map[string]any{"timeoutSeconds": json.RawMessage("120.5")}
		}), nil, belay.CodeInvalid, "approval.timeoutSeconds"},

		// Model.
		{"wrong model", with(func(m map[string]any) { m["model"] = "gpt-other" }), nil, belay.CodeInvalid, "model"},
		{"empty model", with(func(m map[string]any) { m["model"] = "" }), nil, belay.CodeInvalid, "model"},
		{"model of other case", with(func(m map[string]any) { m["model"] = strings.ToUpper(testModel) }), nil, belay.CodeInvalid, "model"},

		// Approval.
		{"unknown policy", with(func(m map[string]any) { m["approval"] = map[string]any{"policy": "yolo"} }), nil, belay.CodeInvalid, "approval.policy"},
		{"empty policy", with(func(m map[string]any) { m["approval"] = map[string]any{"policy": ""} }), nil, belay.CodeInvalid, "approval.policy"},
		{"allow unknown tool", with(func(m map[string]any) {
			m["approval"] = map[string]any{"policy": "allow_list", "allow": []any{"shell", "rm"}}
		}), nil, belay.CodeInvalid, "approval.allow[1]"},
		{"allow duplicate tool", with(func(m map[string]any) {
			m["approval"] = map[string]any{"policy": "ask", "allow": []any{"run_check", "run_check"}}
		}), nil, belay.CodeInvalid, "approval.allow[1]"},
		{"allow under deny_all", with(func(m map[string]any) { m["approval"] = map[string]any{"allow": []any{"shell"}} }), nil, belay.CodeInvalid, "approval.allow"},
		{"approval timeout 0", with(func(m map[string]any) { m["approval"] = map[string]any{"timeoutSeconds": 0} }), nil, belay.CodeInvalid, "approval.timeoutSeconds"},
		{"approval timeout over max", with(func(m map[string]any) { m["approval"] = map[string]any{"timeoutSeconds": 3601} }), nil, belay.CodeInvalid, "approval.timeoutSeconds"},
		{"approval not an object", with(func(m map[string]any) { m["approval"] = "ask" }), nil, belay.CodeInvalid, "approval"},

		// Wire strictness.
		{"unknown top-level field", with(func(m map[string]any) { m["temperature"] = 0.2 }), nil, belay.CodeInvalid, "temperature"},
		{"top-level field in another case", with(func(m map[string]any) { m["Instruction"] = m["instruction"] }), nil, belay.CodeInvalid, "Instruction"},
		{"unknown field in a file", with(func(m map[string]any) {
			m["files"].([]any)[1].(map[string]any)["mode"] = "0755"
		}), nil, belay.CodeInvalid, "files[1].mode"},
		{"unknown field in approval", with(func(m map[string]any) { m["approval"] = map[string]any{"policy": "ask", "autoApprove": true} }), nil, belay.CodeInvalid, "approval.autoApprove"},
		{"unknown field with an odd name", with(func(m map[string]any) { m["a b"] = 1 }), nil, belay.CodeInvalid, `["a b"]`},
		{"duplicate key", raw(`{"instruction":"x","maxSteps":5,"maxSteps":25}`), nil, belay.CodeInvalid, "maxSteps"},
		{"trailing object", func(tb testing.TB) []byte { return append(marshal(tb, baseRequest()), []byte(`{}`)...) }, nil, belay.CodeInvalid, ""},
		{"trailing garbage", func(tb testing.TB) []byte { return append(marshal(tb, baseRequest()), []byte(` x`)...) }, nil, belay.CodeInvalid, ""},
		{"empty body", raw(""), nil, belay.CodeInvalid, ""},
		{"body is an array", raw(`[]`), nil, belay.CodeInvalid, ""},
		{"body is null", raw(`null`), nil, belay.CodeInvalid, ""},
		{"truncated body", func(tb testing.TB) []byte { b := marshal(tb, baseRequest()); return b[:len(b)/2] }, nil, belay.CodeInvalid, ""},
		{"syntax error", raw(`{"instruction" "x"}`), nil, belay.CodeInvalid, ""},
		{"invalid UTF-8 in body", func(tb testing.TB) []byte {
			return []byte(strings.Replace(string(marshal(tb, baseRequest())), canaryContent, canaryContent+"\xff", 1))
		}, nil, belay.CodeInvalid, ""},
		{"lone surrogate escape", func(tb testing.TB) []byte {
			return []byte(strings.Replace(string(marshal(tb, baseRequest())), canaryContent, canaryContent+`\ud800`, 1))
		}, nil, belay.CodeInvalid, ""},
		{"reversed surrogate pair", func(tb testing.TB) []byte {
			return []byte(strings.Replace(string(marshal(tb, baseRequest())), canaryContent, canaryContent+`\udc00\ud800`, 1))
		}, nil, belay.CodeInvalid, ""},
		{"files not an array", with(func(m map[string]any) { m["files"] = map[string]any{} }), nil, belay.CodeInvalid, "files"},
		{"file not an object", with(func(m map[string]any) { m["files"] = []any{"calc.py"} }), nil, belay.CodeInvalid, "files[0]"},
		{"path not a string", withFiles(map[string]any{"path": 7, "content": ""}), nil, belay.CodeInvalid, "files[0].path"},
		{"instruction null", with(func(m map[string]any) { m["instruction"] = nil }), nil, belay.CodeInvalid, "instruction"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lim := testLimits()
			if tt.limits != nil {
				lim = *tt.limits
			}
			req, err := belay.ParseRunRequest(tt.body(t), lim)
			if err == nil {
				t.Fatalf("accepted %+v", req.Files)
			}
			assertError(t, err, tt.code, tt.field)
			t.Log(err)
		})
	}
}

func TestParseRunRequestAccepts(t *testing.T) {
	withGoTest := testLimits()
	withGoTest.AllowedChecks = append(withGoTest.AllowedChecks, []string{"go", "test", "./..."})
	raised := testLimits()
	raised.MaxWallTimeSeconds = 900

	tests := []struct {
		name   string
		body   func(testing.TB) []byte
		limits *belay.Limits
		check  func(tb testing.TB, req belay.RunRequest)
	}{
		{"absent model takes the configured one", with(func(m map[string]any) { delete(m, "model") }), nil,
			func(tb testing.TB, req belay.RunRequest) {
				if req.Model != testModel {
					tb.Errorf("model = %q, want %q", req.Model, testModel)
				}
			}},
		{"configured model", with(func(m map[string]any) { m["model"] = testModel }), nil,
			func(tb testing.TB, req belay.RunRequest) {
				if req.Model != testModel {
					tb.Errorf("model = %q, want %q", req.Model, testModel)
				}
			}},
		{"operator-added check when configured", with(func(m map[string]any) { m["checks"] = []any{[]any{"go", "test", "./..."}} }), &withGoTest,
			func(tb testing.TB, req belay.RunRequest) {
				if want := [][]string{{"go", "test", "./..."}}; !reflect.DeepEqual(req.Checks, want) {
					tb.Errorf("checks = %q, want %q", req.Checks, want)
				}
			}},
		{"raised wall-time ceiling", with(func(m map[string]any) { m["wallTimeSeconds"] = 900 }), &raised,
			func(tb testing.TB, req belay.RunRequest) {
				if req.WallTimeSeconds != 900 {
					tb.Errorf("wallTimeSeconds = %d, want 900", req.WallTimeSeconds)
				}
			}},
		{"bounds", with(func(m map[string]any) {
			m["maxSteps"], m["wallTimeSeconds"] = 20, 1
			m["approval"] = map[string]any{"policy": "ask", "timeoutSeconds": 3600}
		}), nil,
			func(tb testing.TB, req belay.RunRequest) {
				if req.MaxSteps != 20 || req.WallTimeSeconds != 1 || req.Approval.TimeoutSeconds != 3600 {
					tb.Errorf("got maxSteps %d wallTimeSeconds %d timeout %d, want 20, 1, 3600",
						req.MaxSteps, req.WallTimeSeconds, req.Approval.TimeoutSeconds)
				}
			}},
		{"32 files", withFiles(numberedFiles(32)...), nil,
			func(tb testing.TB, req belay.RunRequest) {
				if len(req.Files) != 32 {
					tb.Errorf("%d files, want 32", len(req.Files))
				}
			}},
		{"file of exactly 64 KiB, tree of exactly 512 KiB", withFiles(
			file("f0.py", 64<<10), file("f1.py", 64<<10), file("f2.py", 64<<10), file("f3.py", 64<<10),
			file("f4.py", 64<<10), file("f5.py", 64<<10), file("f6.py", 64<<10), file("f7.py", 64<<10)), nil,
			func(tb testing.TB, req belay.RunRequest) {
				if len(req.Files) != 8 {
					tb.Errorf("%d files, want 8", len(req.Files))
				}
			}},
		{"body of exactly 768 KiB", func(tb testing.TB) []byte {
			b := marshal(tb, baseRequest())
			return append(b, strings.Repeat("\n", 768<<10-len(b))...)
		}, nil, func(testing.TB, belay.RunRequest) {}},
		{"instruction of 32000 two-byte characters", with(func(m map[string]any) { m["instruction"] = strings.Repeat("é", 32000) }), nil,
			func(tb testing.TB, req belay.RunRequest) {
				if len(req.Instruction) != 64000 {
					tb.Errorf("instruction is %d bytes, want 64000", len(req.Instruction))
				}
			}},
		{"escaped surrogate pair", func(tb testing.TB) []byte {
			return []byte(strings.Replace(string(marshal(tb, baseRequest())), canaryContent, canaryContent+`\ud83d\ude00`, 1))
		}, nil, func(tb testing.TB, req belay.RunRequest) {
			if !strings.Contains(req.Files[0].Content, canaryContent+"😀") {
				tb.Errorf("content lost its emoji")
			}
		}},
		{"escaped backslash before u", func(tb testing.TB) []byte {
			return []byte(strings.Replace(string(marshal(tb, baseRequest())), canaryContent, canaryContent+`\\ud800 \"\ud83d\ude00`, 1))
		}, nil, func(tb testing.TB, req belay.RunRequest) {
			if want := canaryContent + `\ud800 "😀`; !strings.Contains(req.Files[0].Content, want) {
				tb.Errorf("content %q does not contain %q", req.Files[0].Content, want)
			}
		}},
		{"escaped NUL-free control characters in content", with(func(m map[string]any) {
			m["files"].([]any)[0].(map[string]any)["content"] = "a\tb\r\n\f"
		}), nil, func(tb testing.TB, req belay.RunRequest) {
			if req.Files[0].Content != "a\tb\r\n\f" {
				tb.Errorf("content = %q", req.Files[0].Content)
			}
		}},
		{"extensions and names ignore case, unicode paths", withFiles(filePath("README.MD"), filePath("Makefile"),
			filePath("docs/résumé.txt"), map[string]any{"path": "pkg/__init__.py", "content": ""}), nil,
			func(tb testing.TB, req belay.RunRequest) {
				if len(req.Files) != 4 {
					tb.Errorf("%d files, want 4", len(req.Files))
				}
			}},
		{"nested subtree entry", with(func(m map[string]any) {
			m["files"] = []any{filePath("src/a/b/c.py"), filePath("src/d.py")}
			m["allowedPaths"] = []any{"src/a/**", "src/**", "src/d.py"}
		}), nil, func(tb testing.TB, req belay.RunRequest) {
			if want := []string{"src/a/**", "src/**", "src/d.py"}; !reflect.DeepEqual(req.AllowedPaths, want) {
				tb.Errorf("allowedPaths = %q, want %q", req.AllowedPaths, want)
			}
		}},
		{"empty allow list becomes nil", with(func(m map[string]any) {
			m["approval"] = map[string]any{"policy": "allow_list", "allow": []any{}}
		}), nil, func(tb testing.TB, req belay.RunRequest) {
			if req.Approval.Allow != nil {
				tb.Errorf("allow = %#v, want nil", req.Approval.Allow)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lim := testLimits()
			if tt.limits != nil {
				lim = *tt.limits
			}
			req, err := belay.ParseRunRequest(tt.body(t), lim)
			if err != nil {
				t.Fatalf("rejected: %v", err)
			}
			tt.check(t, req)
		})
	}
}

func TestParseRunRequestCanonical(t *testing.T) {
	body := `{
		"instruction": "Fix the failing test in calc.py",
		"files": [
			{"path": "tests/test_calc.py", "content": "from calc import add\n"},
			{"content": "def add(a, b):\n    return a - b\n", "path": "calc.py"}
		],
		"allowedPaths": ["calc.py", "tests/**"],
		"checks": [["python3", "-m", "pytest", "-q"], ["git", "diff", "--check"]],
		"approval": {"policy": "ask", "allow": ["run_check"]}
	}`
	got, err := belay.ParseRunRequest([]byte(body), testLimits())
	if err != nil {
		t.Fatalf("ParseRunRequest: %v", err)
	}
	want := belay.RunRequest{
		Instruction: "Fix the failing test in calc.py",
		Model:       testModel,
		Files: []belay.File{
			{Path: "tests/test_calc.py", Content: "from calc import add\n"},
			{Path: "calc.py", Content: "def add(a, b):\n    return a - b\n"},
		},
		AllowedPaths:    []string{"calc.py", "tests/**"},
		Checks:          [][]string{{"python3", "-m", "pytest", "-q"}, {"git", "diff", "--check"}},
		MaxSteps:        12,
		WallTimeSeconds: 180,
		Approval:        belay.ApprovalConfig{Policy: belay.PolicyAsk, Allow: []string{"run_check"}, TimeoutSeconds: 120},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("canonical request\n got %#v\nwant %#v", got, want)
	}
	if got.MaxRequests() != 14 {
		t.Errorf("MaxRequests = %d, want 14", got.MaxRequests())
	}

	// The canonical form is a fixed point: validating it again or sending it
	// back as a body changes nothing.
	again, err := testLimits().Validate(got)
	if err != nil || !reflect.DeepEqual(again, got) {
		t.Fatalf("Validate(canonical) = %#v, %v; want it unchanged", again, err)
	}
	reparsed, err := belay.ParseRunRequest(marshal(t, got), testLimits())
	if err != nil || !reflect.DeepEqual(reparsed, got) {
		t.Fatalf("ParseRunRequest(json(canonical)) = %#v, %v; want it unchanged", reparsed, err)
	}
}

func TestParseRunRequestDefaults(t *testing.T) {
	lim := testLimits()
	lim.DefaultMaxSteps, lim.DefaultWallTimeSeconds, lim.DefaultApprovalTimeoutSeconds = 7, 60, 30
	got, err := belay.ParseRunRequest(marshal(t, baseRequest()), lim)
	if err != nil {
		t.Fatalf("ParseRunRequest: %v", err)
	}
	want := belay.ApprovalConfig{Policy: belay.PolicyDenyAll, TimeoutSeconds: 30}
	if got.MaxSteps != 7 || got.WallTimeSeconds != 60 || !reflect.DeepEqual(got.Approval, want) || got.Model != testModel {
		t.Fatalf("defaults: maxSteps %d wallTimeSeconds %d approval %#v model %q; want 7, 60, %#v, %q",
			got.MaxSteps, got.WallTimeSeconds, got.Approval, got.Model, want, testModel)
	}
}

// TestErrorMessagesAreActionable checks that a message says what is allowed,
// not only that something is wrong.
func TestErrorMessagesAreActionable(t *testing.T) {
	tests := []struct {
		name string
		body func(testing.TB) []byte
		want []string
	}{
		{"shell string", with(func(m map[string]any) { m["checks"] = []any{[]any{"python3 -m pytest -q"}} }),
			[]string{`["python3 -m pytest -q"]`, `["python3", "-m", "pytest", "-q"]`, "own string"}},
		{"range", with(func(m map[string]any) { m["maxSteps"] = 21 }), []string{"21", "from 1 to 20"}},
		{"model", with(func(m map[string]any) { m["model"] = "other" }), []string{`"other"`, `"` + testModel + `"`}},
		{"extension", withFiles(filePath("run.exe")), []string{`"run.exe"`, ".py", "Makefile"}},
		{"directory entry", with(func(m map[string]any) { m["allowedPaths"] = []any{"tests"} }), []string{`"tests/**"`}},
		{"unknown field", with(func(m map[string]any) { m["maxStep"] = 3 }), []string{"maxSteps"}},
		{"long path is truncated", withFiles(filePath(strings.Repeat("d/", 400) + "x.exe")), []string{"..."}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := belay.ParseRunRequest(tt.body(t), testLimits())
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("message %q does not mention %q", err.Error(), w)
				}
			}
			if len(err.Error()) > 1000 {
				t.Errorf("message is %d bytes long", len(err.Error()))
			}
		})
	}
}

func validRequest() belay.RunRequest {
	return belay.RunRequest{
		Instruction:  "Fix it. " + canaryInstruction,
		Files:        []belay.File{{Path: "calc.py", Content: canaryContent}},
		AllowedPaths: []string{"calc.py"},
		Checks:       [][]string{{"git", "diff", "--check"}},
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(r *belay.RunRequest)
		code   belay.Code
		field  string
	}{
		{"invalid UTF-8 instruction", func(r *belay.RunRequest) { r.Instruction = "fix \xff" }, belay.CodeInvalid, "instruction"},
		{"invalid UTF-8 content", func(r *belay.RunRequest) { r.Files[0].Content = canaryContent + "\xc3" }, belay.CodeInvalid, "files[0].content"},
		{"invalid UTF-8 path", func(r *belay.RunRequest) { r.Files[0].Path = "a\xff.py" }, belay.CodeInvalid, "files[0].path"},
		{"negative maxSteps", func(r *belay.RunRequest) { r.MaxSteps = -3 }, belay.CodeInvalid, "maxSteps"},
		{"negative wallTimeSeconds", func(r *belay.RunRequest) { r.WallTimeSeconds = -1 }, belay.CodeInvalid, "wallTimeSeconds"},
		{"negative approval timeout", func(r *belay.RunRequest) { r.Approval.TimeoutSeconds = -1 }, belay.CodeInvalid, "approval.timeoutSeconds"},
		{"unknown policy", func(r *belay.RunRequest) { r.Approval.Policy = "Ask" }, belay.CodeInvalid, "approval.policy"},
		{"allow under allow_all", func(r *belay.RunRequest) {
			r.Approval = belay.ApprovalConfig{Policy: belay.PolicyAllowAll, Allow: []string{"shell"}}
		}, belay.CodeInvalid, "approval.allow"},
		{"nil check", func(r *belay.RunRequest) { r.Checks = [][]string{nil} }, belay.CodeInvalid, "checks[0]"},
		{"wrong model", func(r *belay.RunRequest) { r.Model = "x" }, belay.CodeInvalid, "model"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := validRequest()
			tt.mutate(&req)
			_, err := testLimits().Validate(req)
			assertError(t, err, tt.code, tt.field)
		})
	}
}

func TestValidateFillsZeroFieldsAndCopies(t *testing.T) {
	req := validRequest()
	req.Approval.Allow = []string{}
	got, err := testLimits().Validate(req)
	if err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if got.Model != testModel || got.MaxSteps != 12 || got.WallTimeSeconds != 180 ||
		got.Approval.Policy != belay.PolicyDenyAll || got.Approval.TimeoutSeconds != 120 || got.Approval.Allow != nil {
		t.Fatalf("defaults not filled: %#v", got)
	}
	again, err := testLimits().Validate(got)
	if err != nil || !reflect.DeepEqual(again, got) {
		t.Fatalf("Validate(canonical) = %#v, %v; want it unchanged", again, err)
	}
	// The canonical request shares no slice with the input: a caller that
	// reuses its request cannot change a stored run.
	req.Files[0].Path = "changed.py"
	req.AllowedPaths[0] = "changed.py"
	req.Checks[0][0] = "rm"
	if got.Files[0].Path != "calc.py" || got.AllowedPaths[0] != "calc.py" || got.Checks[0][0] != "git" {
		t.Fatalf("canonical request aliases the input: %#v", got)
	}
}

func TestValidateWithoutModelIsInternal(t *testing.T) {
	_, err := belay.DefaultLimits("").Validate(validRequest())
	if code := belay.ErrorCode(err); code != belay.CodeInternal {
		t.Fatalf("code %q (%v), want internal", code, err)
	}
}

func TestCheckPath(t *testing.T) {
	tests := []struct {
		path string
		ok   bool
	}{
		{"calc.py", true},
		{"a/b/c.py", true},
		{"..py", true},
		{"a/..b/c", true},
		{".github/workflows/ci.yml", true},
		{".gitignore", true},
		{"a/.gitkeep", true},
		{"résumé/ünï.md", true},
		{"", false},
		{"/calc.py", false},
		{"../calc.py", false},
		{"a/../calc.py", false},
		{"a/..", false},
		{"..", false},
		{".", false},
		{"./a", false},
		{"a/./b", false},
		{"a//b", false},
		{"a/", false},
		{".git", false},
		{".git/config", false},
		{"a/.git/config", false},
		{"a/.GIT", false},
		{".gIt/x", false},
		{`a\b`, false},
		{"a\x00b", false},
		{"a\nb", false},
		{"a\u0085b", false},
		{"a\xffb", false},
		{strings.Repeat("a", 256), false},
		{strings.Repeat("a", 255), true},
		{strings.Repeat("abcdefgh/", 120) + "x", false},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%.40q", tt.path), func(t *testing.T) {
			err := belay.CheckPath(tt.path)
			if (err == nil) != tt.ok {
				t.Fatalf("CheckPath(%q) = %v, want ok=%v", tt.path, err, tt.ok)
			}
			if err != nil && len(err.Error()) > 300 {
				t.Errorf("error is %d bytes; paths in messages must be truncated", len(err.Error()))
			}
		})
	}
}

func TestExtensionAllowed(t *testing.T) {
	lim := testLimits()
	tests := []struct {
		path string
		ok   bool
	}{
		{"calc.py", true},
		{"a/b/calc.PY", true},
		{"README.md", true},
		{"Makefile", true},
		{"sub/Dockerfile", true},
		{"makefile", true},
		{"archive.tar.gz", false},
		{"calc.py.exe", false},
		{"calc", false},
		{"calc.", false},
		{".env", false},
		{"Makefile.bak", false},
		{"py/calc", false},
	}
	for _, tt := range tests {
		if got := lim.ExtensionAllowed(tt.path); got != tt.ok {
			t.Errorf("ExtensionAllowed(%q) = %v, want %v", tt.path, got, tt.ok)
		}
	}
}

func TestRequestHash(t *testing.T) {
	lim := testLimits()
	parse := func(tb testing.TB, body []byte) belay.RunRequest {
		tb.Helper()
		req, err := belay.ParseRunRequest(body, lim)
		if err != nil {
			tb.Fatalf("ParseRunRequest: %v", err)
		}
		return req
	}
	base := marshal(t, baseRequest())
	h := belay.RequestHash(parse(t, base))
	if len(h) != 64 || strings.Trim(h, "0123456789abcdef") != "" {
		t.Fatalf("hash %q is not 64 hex digits", h)
	}
	if again := belay.RequestHash(parse(t, base)); again != h {
		t.Fatalf("same body, different hash: %s vs %s", h, again)
	}

	same := map[string][]byte{
		"indented": func() []byte {
			b, err := json.MarshalIndent(baseRequest(), "", "    ")
			if err != nil {
				t.Fatal(err)
			}
			return b
		}(),
		"defaults spelled out": with(func(m map[string]any) {
			m["model"], m["maxSteps"], m["wallTimeSeconds"] = testModel, 12, 180
			m["approval"] = map[string]any{"policy": "deny_all", "timeoutSeconds": 120}
		})(t),
	}
	for name, body := range same {
		if got := belay.RequestHash(parse(t, body)); got != h {
			t.Errorf("%s: hash %s, want %s (same canonical request)", name, got, h)
		}
	}

	different := map[string][]byte{
		"maxSteps":    with(func(m map[string]any) { m["maxSteps"] = 11 })(t),
		"instruction": with(func(m map[string]any) { m["instruction"] = "Fix it." })(t),
		"file order": with(func(m map[string]any) {
			f := m["files"].([]any)
			f[0], f[1] = f[1], f[0]
		})(t),
		"content":  with(func(m map[string]any) { m["files"].([]any)[1].(map[string]any)["content"] = "" })(t),
		"approval": with(func(m map[string]any) { m["approval"] = map[string]any{"policy": "ask"} })(t),
	}
	for name, body := range different {
		if got := belay.RequestHash(parse(t, body)); got == h {
			t.Errorf("%s changed but the hash did not", name)
		}
	}
}

func TestAgentToolNamesIsACopy(t *testing.T) {
	names := belay.AgentToolNames()
	if len(names) != 8 || names[0] != "list_files" || names[7] != "finish" {
		t.Fatalf("AgentToolNames() = %q", names)
	}
	names[0] = "rm"
	if belay.AgentToolNames()[0] != "list_files" {
		t.Fatal("changing the returned slice changed the tool set")
	}
}

func BenchmarkParseRunRequest(b *testing.B) {
	// A body near the size limits: 8 files of 64 KiB of source-like text.
	line := "    return add(a, b)  # é\n"
	files := make([]any, 8)
	for i := range files {
		files[i] = map[string]any{"path": fmt.Sprintf("pkg/m%d.py", i), "content": strings.Repeat(line, (64<<10)/len(line))}
	}
	m := baseRequest()
	m["files"], m["allowedPaths"] = files, []any{"pkg/**"}
	body := marshal(b, m)
	lim := testLimits()
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := belay.ParseRunRequest(body, lim); err != nil {
			b.Fatal(err)
		}
	}
}
