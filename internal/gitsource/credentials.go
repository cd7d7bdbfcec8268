package gitsource

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"strings"
)

// Credentials are the control plane's git credentials, by URL prefix. They
// are used for fetching sources and pushing safe outputs, and never reach
// a sandbox, a run record, a log line or an error message.
//
// The text form is git's credential-store format, one credential a line:
// https://USER:PASSWORD@HOST[/PATH]. Blank lines and lines starting with
// # are skipped. A URL matches a credential with its scheme, host (and
// port) and, when the credential has a path, a path under it; the longest
// path wins. For GitHub, the user is x-access-token (or any name) and the
// password a token; the same token authorizes the REST API calls of the
// safe outputs.
type Credentials struct {
	entries []credential
}

type credential struct {
	scheme, host, path string
	user, password     string
}

// ParseCredentials reads credentials in git's credential-store format. An
// error names the line, never its content.
func ParseCredentials(r io.Reader) (*Credentials, error) {
	c := &Credentials{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 64<<10)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		u, err := url.Parse(line)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			return nil, fmt.Errorf("git credentials line %d is not an http(s) URL with credentials (https://USER:TOKEN@HOST)", n)
		}
		pass, ok := u.User.Password()
		if u.User == nil || !ok || pass == "" {
			return nil, fmt.Errorf("git credentials line %d has no password (https://USER:TOKEN@HOST)", n)
		}
		c.entries = append(c.entries, credential{
			scheme: u.Scheme, host: strings.ToLower(u.Host), path: strings.Trim(u.Path, "/"),
			user: u.User.Username(), password: pass,
		})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read git credentials: %w", err)
	}
	return c, nil
}

// For returns the credential for the repository URL raw: the user and
// password of the matching entry with the longest path, or ok=false.
func (c *Credentials) For(raw string) (user, password string, ok bool) {
	if c == nil {
		return "", "", false
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "", "", false
	}
	host, path := strings.ToLower(u.Host), strings.Trim(u.Path, "/")
	best := -1
	for i, e := range c.entries {
		if e.scheme != u.Scheme || e.host != host {
			continue
		}
		if e.path != "" && path != e.path && !strings.HasPrefix(path, e.path+"/") {
			continue
		}
		if best < 0 || len(e.path) > len(c.entries[best].path) {
			best = i
		}
	}
	if best < 0 {
		return "", "", false
	}
	return c.entries[best].user, c.entries[best].password, true
}

// Secrets returns every password, for tests and redaction.
func (c *Credentials) Secrets() []string {
	if c == nil {
		return nil
	}
	out := make([]string, 0, len(c.entries))
	for _, e := range c.entries {
		out = append(out, e.password)
	}
	return out
}

// String never shows a password.
func (c *Credentials) String() string {
	if c == nil {
		return "gitsource.Credentials{}"
	}
	hosts := make([]string, 0, len(c.entries))
	for _, e := range c.entries {
		hosts = append(hosts, e.scheme+"://"+e.host+"/"+e.path)
	}
	return "gitsource.Credentials{" + strings.Join(hosts, " ") + " [passwords redacted]}"
}

// LogValue is String for slog.
func (c *Credentials) LogValue() slog.Value { return slog.StringValue(c.String()) }
