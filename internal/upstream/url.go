package upstream

import (
	"errors"
	"net"
	"net/url"
	"strings"
)

// ValidateChatURL checks an OpenAI-compatible provider's URL: https, a
// host, no credentials, no query, no fragment, a path ending in
// /chat/completions. Plain http is allowed only when allowLoopbackHTTP is
// set and the host is a loopback address (a model served on the same
// machine). The error never repeats the URL, which could hold credentials.
func ValidateChatURL(raw string, allowLoopbackHTTP bool) error {
	u, err := checkURL(raw, allowLoopbackHTTP)
	if err != nil {
		return err
	}
	if !strings.HasSuffix(u.Path, "/chat/completions") {
		return errors.New("upstream URL path must end with /chat/completions")
	}
	return nil
}

// ValidateBaseURL checks the base URL of a provider whose SDK adds the
// path itself (Anthropic's API, a Bedrock runtime endpoint): the rules of
// ValidateChatURL but any path.
func ValidateBaseURL(raw string, allowLoopbackHTTP bool) error {
	_, err := checkURL(raw, allowLoopbackHTTP)
	return err
}

func checkURL(raw string, allowLoopbackHTTP bool) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil || raw == "" {
		return nil, errors.New("upstream URL is not a valid URL")
	}
	switch {
	case u.Opaque != "" || u.Host == "":
		return nil, errors.New("upstream URL must be absolute, with a host")
	case u.User != nil:
		return nil, errors.New("upstream URL must not carry credentials; the key comes from the key source")
	case u.RawQuery != "" || u.ForceQuery:
		return nil, errors.New("upstream URL must not have a query")
	case u.Fragment != "" || strings.Contains(raw, "#"):
		return nil, errors.New("upstream URL must not have a fragment")
	}
	switch u.Scheme {
	case "https":
		return u, nil
	case "http":
		if !allowLoopbackHTTP {
			return nil, errors.New("upstream URL must use https")
		}
		if !IsLoopbackHost(u.Hostname()) {
			return nil, errors.New("upstream URL may use plain http only for a loopback host")
		}
		return u, nil
	default:
		return nil, errors.New("upstream URL must use https")
	}
}

// IsLoopbackHost reports whether host (a URL's Hostname, without port or
// brackets) is "localhost" or a loopback IP address: the one place where
// belay lets a secret travel over plain http.
func IsLoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
