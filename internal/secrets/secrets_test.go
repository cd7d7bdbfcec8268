package secrets_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/belay-dev/belay/internal/secrets"
)

const canary = "sk-CANARY-e2b7c90a41d3"

func TestStaticSource(t *testing.T) {
	tests := []struct {
		value   string
		wantErr bool
	}{
		{canary, false},
		{"", true},
		{" \n", true},
	}
	for _, tt := range tests {
		got, err := secrets.NewStaticSource(tt.value).Fetch(t.Context())
		if (err != nil) != tt.wantErr {
			t.Fatalf("Fetch(%q) error %v, want error %v", tt.value, err, tt.wantErr)
		}
		if err == nil && got != tt.value {
			t.Fatalf("Fetch = %q, want %q", got, tt.value)
		}
	}
}

func writeKey(tb testing.TB, path, content string, mode os.FileMode) {
	tb.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		tb.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil { // WriteFile's mode is masked by the umask
		tb.Fatal(err)
	}
}

func TestFileSource(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "target-key")
	writeKey(t, target, canary, 0o600)

	tests := []struct {
		name    string
		setup   func(path string)
		want    string
		wantErr string // substring of the error; "" means success
	}{
		{"0600", func(p string) { writeKey(t, p, canary+"\n", 0o600) }, canary, ""},
		{"0400", func(p string) { writeKey(t, p, "  "+canary+"\r\n", 0o400) }, canary, ""},
		{"0644", func(p string) { writeKey(t, p, canary, 0o644) }, "", "chmod 600"},
		{"0640", func(p string) { writeKey(t, p, canary, 0o640) }, "", "mode 0640"},
		{"0604", func(p string) { writeKey(t, p, canary, 0o604) }, "", "readable beyond its owner"},
		{"symlink", func(p string) {
			if err := os.Symlink(target, p); err != nil {
				t.Fatal(err)
			}
		}, "", "symlink"},
		{"directory", func(p string) {
			if err := os.Mkdir(p, 0o700); err != nil {
				t.Fatal(err)
			}
		}, "", "not a regular file"},
		{"missing", func(string) {}, "", "no such file"},
		{"empty", func(p string) { writeKey(t, p, "\n", 0o600) }, "", "empty"},
		{"too-large", func(p string) { writeKey(t, p, canary+strings.Repeat("x", 64<<10), 0o600) }, "", "larger than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(dir, tt.name)
			tt.setup(path)
			src := secrets.NewFileSource(path)
			got, err := src.Fetch(t.Context())
			if tt.wantErr == "" {
				if err != nil || got != tt.want {
					t.Fatalf("Fetch = %q, %v; want %q", got, err, tt.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("Fetch succeeded with %d bytes, want an error about %q", len(got), tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Fetch error %q does not say %q", err, tt.wantErr)
			}
			if !strings.Contains(err.Error(), path) {
				t.Fatalf("Fetch error %q does not name the file", err)
			}
			if strings.Contains(fmt.Sprintf("%v %+v", err, src), canary) {
				t.Fatalf("Fetch error shows the key: %v", err)
			}
		})
	}
}

// A key file fixed on disk is picked up at the next fetch: nothing about a
// refused file is remembered.
func TestFileSourceRereads(t *testing.T) {
	path := filepath.Join(t.TempDir(), "key")
	writeKey(t, path, "first", 0o644)
	src := secrets.NewFileSource(path)
	if _, err := src.Fetch(t.Context()); err == nil {
		t.Fatal("Fetch of a 0644 file succeeded")
	}
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
	writeKey(t, path, "second", 0o600)
	if got, err := src.Fetch(t.Context()); err != nil || got != "second" {
		t.Fatalf("Fetch after fixing the file = %q, %v; want second", got, err)
	}
}

func TestSecretValue(t *testing.T) {
	tests := []struct {
		name, secret, field string
		want                string
		wantErr             string
	}{
		{"plain", canary, "", canary, ""},
		{"plain-trimmed", "\n " + canary + " \n", "", canary, ""},
		{"plain-empty", "  ", "", "", "empty"},
		{"json-field", `{"apiKey":"` + canary + `","other":1}`, "apiKey", canary, ""},
		{"json-field-trimmed", `{"apiKey":" ` + canary + `\n"}`, "apiKey", canary, ""},
		{"json-escaped", `{"apiKey":"sk-\u0041BC"}`, "apiKey", "sk-ABC", ""},
		{"json-plain-whole", `{"apiKey":"` + canary + `"}`, "", `{"apiKey":"` + canary + `"}`, ""},
		{"missing-field", `{"apiKey":"` + canary + `"}`, "token", "", `no field "token"`},
		{"field-case-matters", `{"ApiKey":"` + canary + `"}`, "apiKey", "", `no field "apiKey"`},
		{"not-json", canary, "apiKey", "", "not a JSON object"},
		{"json-syntax-error", `{"apiKey":` + canary + `}`, "apiKey", "", "not a JSON object"},
		{"json-truncated", `{"apiKey":"` + canary, "apiKey", "", "not a JSON object"},
		{"json-array", `["` + canary + `"]`, "apiKey", "", "not a JSON object"},
		{"json-null", `null`, "apiKey", "", "not a JSON object"},
		{"field-number", `{"apiKey":12345}`, "apiKey", "", "not a JSON string"},
		{"field-object", `{"apiKey":{"v":"` + canary + `"}}`, "apiKey", "", "not a JSON string"},
		{"field-empty", `{"apiKey":""}`, "apiKey", "", `field "apiKey" is empty`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := secrets.SecretValue(tt.secret, tt.field)
			if tt.wantErr == "" {
				if err != nil || got != tt.want {
					t.Fatalf("SecretValue = %q, %v; want %q", got, err, tt.want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("SecretValue error %v, want one saying %q", err, tt.wantErr)
			}
			// Not the canary, nor any piece of it a JSON error would quote.
			for _, piece := range []string{canary, "CANARY", "e2b7c90a41d3"} {
				if strings.Contains(fmt.Sprintf("%v %+v", err, err), piece) {
					t.Fatalf("SecretValue error shows the secret: %v", err)
				}
			}
		})
	}
}

func TestSourcesFormatWithoutSecrets(t *testing.T) {
	tests := []struct {
		src  fmt.Stringer
		want string
	}{
		{secrets.NewStaticSource(canary), "StaticSource(redacted)"},
		{secrets.NewFileSource("/etc/belay/key"), "FileSource(/etc/belay/key)"},
		{secrets.NewSecretsManagerSource(nil, "belay/provider-key", secrets.WithJSONField("apiKey")), "SecretsManagerSource(belay/provider-key#apiKey)"},
		{secrets.NewSecretsManagerSource(nil, "belay/control-token"), "SecretsManagerSource(belay/control-token)"},
	}
	for _, tt := range tests {
		if got := tt.src.String(); got != tt.want {
			t.Errorf("String() = %q, want %q", got, tt.want)
		}
	}
}
