package github

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	gh "github.com/google/go-github/v81/github"
)

// DefaultAPIURL is GitHub's REST API.
const DefaultAPIURL = "https://api.github.com/"

// Client makes the REST calls of the safe outputs with a repository's
// token. It holds no token itself: tokenFor is asked per repository.
type Client struct {
	base     *url.URL
	http     *http.Client
	tokenFor func(repository string) (string, bool)
}

// NewClient returns a client of the REST API at apiURL (DefaultAPIURL when
// empty; a GitHub Enterprise server's /api/v3/ otherwise), sending with
// httpClient (nil for a default one) and authorizing each call with
// tokenFor's token for the repository.
func NewClient(apiURL string, httpClient *http.Client, tokenFor func(repository string) (string, bool)) (*Client, error) {
	if apiURL == "" {
		apiURL = DefaultAPIURL
	}
	if !strings.HasSuffix(apiURL, "/") {
		apiURL += "/"
	}
	u, err := url.Parse(apiURL)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil {
		return nil, fmt.Errorf("github: API URL %q is not an http(s) URL without credentials", apiURL)
	}
	if httpClient == nil {
		httpClient = &http.Client{}
	}
	return &Client{base: u, http: httpClient, tokenFor: tokenFor}, nil
}

// api returns a go-github client for repository ("owner/name"), with its
// owner and name.
func (c *Client) api(repository string) (*gh.Client, string, string, error) {
	owner, name, ok := strings.Cut(repository, "/")
	if !ok || owner == "" || name == "" || strings.Contains(name, "/") {
		return nil, "", "", fmt.Errorf("github: %q is not owner/name", repository)
	}
	tok, ok := c.tokenFor(repository)
	if !ok {
		return nil, "", "", fmt.Errorf("github: no token for %s (BELAY_GITHUB_TOKEN, or a git credential for it)", repository)
	}
	cl := gh.NewClient(c.http).WithAuthToken(tok)
	base := *c.base
	cl.BaseURL = &base
	return cl, owner, name, nil
}

// PullRequest is an opened pull request.
type PullRequest struct {
	Number int
	URL    string
}

// ErrPullRequestExists is a pull request that is already open for the
// branch (a second publish of one run).
var ErrPullRequestExists = errors.New("a pull request for the branch exists")

// CreatePullRequest opens a pull request of head into base.
func (c *Client) CreatePullRequest(ctx context.Context, repository, head, base, title, body string) (PullRequest, error) {
	cl, owner, name, err := c.api(repository)
	if err != nil {
		return PullRequest{}, err
	}
	pr, resp, err := cl.PullRequests.Create(ctx, owner, name, &gh.NewPullRequest{
		Title: gh.Ptr(title), Head: gh.Ptr(head), Base: gh.Ptr(base), Body: gh.Ptr(body),
		MaintainerCanModify: gh.Ptr(true),
	})
	if err != nil {
		if resp != nil && resp.StatusCode == http.StatusUnprocessableEntity && strings.Contains(err.Error(), "already exists") {
			return PullRequest{}, ErrPullRequestExists
		}
		return PullRequest{}, fmt.Errorf("github: open a pull request of %s into %s in %s: %w", head, base, repository, err)
	}
	return PullRequest{Number: pr.GetNumber(), URL: pr.GetHTMLURL()}, nil
}

// PullRequestHead returns the head branch of pull request number, for a
// change made on a comment's pull request to go back into it (its base
// branch when the head lives in a fork).
func (c *Client) PullRequestHead(ctx context.Context, repository string, number int) (string, error) {
	cl, owner, name, err := c.api(repository)
	if err != nil {
		return "", err
	}
	pr, _, err := cl.PullRequests.Get(ctx, owner, name, number)
	if err != nil {
		return "", fmt.Errorf("github: read pull request #%d of %s: %w", number, repository, err)
	}
	if full := pr.GetHead().GetRepo().GetFullName(); full != "" && !strings.EqualFold(full, repository) {
		return pr.GetBase().GetRef(), nil
	}
	return pr.GetHead().GetRef(), nil
}

// Comment comments on issue (or pull request) number.
func (c *Client) Comment(ctx context.Context, repository string, number int, body string) error {
	cl, owner, name, err := c.api(repository)
	if err != nil {
		return err
	}
	if _, _, err := cl.Issues.CreateComment(ctx, owner, name, number, &gh.IssueComment{Body: gh.Ptr(body)}); err != nil {
		return fmt.Errorf("github: comment on #%d of %s: %w", number, repository, err)
	}
	return nil
}

// CommitComment comments on a commit, for runs a push started.
func (c *Client) CommitComment(ctx context.Context, repository, sha, body string) error {
	cl, owner, name, err := c.api(repository)
	if err != nil {
		return err
	}
	if _, _, err := cl.Repositories.CreateComment(ctx, owner, name, sha, &gh.RepositoryComment{Body: gh.Ptr(body)}); err != nil {
		return fmt.Errorf("github: comment on commit %s of %s: %w", sha, repository, err)
	}
	return nil
}
