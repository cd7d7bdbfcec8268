package wire

import (
	"encoding/json"
	"net/url"
	"strconv"
	"time"
)

// CheckpointVersion is the version of the checkpoint format this code
// writes and the only one it reads.
const CheckpointVersion = 1

// Checkpoint is what a sandbox saves while it works (DESIGN.md
// "Checkpoints and resume"): the body of PUT
// /internal/v1/runs/{id}/checkpoints/{seq} (events audience) and the answer
// of GET /internal/v1/runs/{id}/checkpoints/latest, which the sandbox of
// the next attempt reads to continue the run. It is JSON, at most
// belay.MaxCheckpointBytes. The control plane reads only its first fields;
// Agent and Workspace are the sandbox's, handed back as they were.
type Checkpoint struct {
	Version int    `json:"version"`
	RunID   string `json:"runId"`
	Attempt int    `json:"attempt"`
	// Seq increases with each checkpoint of the run, across attempts.
	Seq int64 `json:"seq"`
	// Step is the agent's step (model calls answered) when it was saved.
	Step int `json:"step"`
	// Pending is the tool call that had started and not yet answered when
	// it was saved; nil between calls.
	Pending *PendingCall `json:"pending,omitempty"`
	// Unresumable, when set, says why the sandbox could not save a
	// checkpoint to resume from (it would have been over the cap): the
	// control plane then does not resume the run. Agent and Workspace are
	// empty.
	Unresumable string `json:"unresumable,omitempty"`
	// Agent is the agent loop's state (internal/agent.State): the
	// conversation so far, steps and usage.
	Agent json.RawMessage `json:"agent,omitempty"`
	// Workspace is the repository's change since its base commit.
	Workspace WorkspaceChange `json:"workspace"`
}

// PendingCall names the tool call a checkpoint was saved during.
type PendingCall struct {
	ID    string    `json:"id"`
	Name  string    `json:"name"`
	Step  int       `json:"step"`
	Since time.Time `json:"since"`
}

// WorkspaceChange is the repository's change since its base commit, file
// by file, binary-safe: every regular file whose content or executable bit
// differs from the base, every new one, and every base file that is gone.
// What the base commit leaves out (.git folders, and the files checks leave
// behind: __pycache__, *.pyc, .pytest_cache) is left out here too; so is
// anything that is not a regular file (a symbolic link, a FIFO), named in
// Omitted.
type WorkspaceChange struct {
	Files   []FileChange `json:"files"`
	Omitted []string     `json:"omitted,omitempty"`
}

// FileChange is one changed path: deleted, or its whole new content, as
// Text when it is valid UTF-8 and as Binary (base64 in JSON) otherwise.
type FileChange struct {
	Path       string  `json:"path"`
	Deleted    bool    `json:"deleted,omitempty"`
	Executable bool    `json:"executable,omitempty"`
	Text       *string `json:"text,omitempty"`
	Binary     []byte  `json:"binary,omitempty"`
}

// Content returns the file's new content.
func (f FileChange) Content() []byte {
	if f.Text != nil {
		return []byte(*f.Text)
	}
	return f.Binary
}

// CheckpointPath is the route a sandbox saves checkpoint seq of its run
// to, relative to the API's base URL: PUT it with the run's events token.
func CheckpointPath(runID string, seq int64) string {
	return "internal/v1/runs/" + url.PathEscape(runID) + "/checkpoints/" + strconv.FormatInt(seq, 10)
}

// LatestCheckpointPath is the route a sandbox reads its run's latest
// checkpoint from: GET it with the run's events token.
func LatestCheckpointPath(runID string) string {
	return "internal/v1/runs/" + url.PathEscape(runID) + "/checkpoints/latest"
}
