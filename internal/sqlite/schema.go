package sqlite

import (
	"context"
	"database/sql"
	"fmt"
)

// migrations bring a database from schema version i to i+1 (PRAGMA
// user_version). They are only ever appended to: a released step never
// changes, so every database walks the same path.
//
// Times are Unix nanoseconds (NULL when unset); lists and the run request
// are JSON. A capability holds only its model, expiry, counts and state:
// never a key or token.
var migrations = []string{
	// 1: runs, their event logs, batch ids, capabilities and approvals.
	`
CREATE TABLE runs (
	id                TEXT PRIMARY KEY,
	status            TEXT NOT NULL,
	request           TEXT NOT NULL,
	request_hash      TEXT NOT NULL,
	idempotency_key   TEXT UNIQUE,
	created_at        INTEGER NOT NULL,
	updated_at        INTEGER NOT NULL,
	started_at        INTEGER,
	finished_at       INTEGER,
	cancel_requested  INTEGER NOT NULL DEFAULT 0,
	reason            TEXT NOT NULL DEFAULT '',
	exit_code         INTEGER,
	model_requests    INTEGER NOT NULL DEFAULT 0,
	max_requests      INTEGER NOT NULL DEFAULT 0,
	prompt_tokens     INTEGER NOT NULL DEFAULT 0,
	completion_tokens INTEGER NOT NULL DEFAULT 0,
	checks            TEXT,
	changed_files     TEXT,
	artifacts         TEXT,
	last_seq          INTEGER NOT NULL DEFAULT 0
) STRICT;
CREATE INDEX runs_newest ON runs (created_at DESC, id DESC);
CREATE INDEX runs_status_newest ON runs (status, created_at DESC, id DESC);

CREATE TABLE events (
	run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
	seq    INTEGER NOT NULL,
	time   INTEGER,
	type   TEXT NOT NULL,
	data   BLOB,
	PRIMARY KEY (run_id, seq)
) STRICT, WITHOUT ROWID;

-- A batch id outlives its events: a retried append whose events have left
-- the buffer must still append nothing.
CREATE TABLE event_batches (
	run_id    TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
	batch_id  TEXT NOT NULL,
	first_seq INTEGER NOT NULL,
	last_seq  INTEGER NOT NULL,
	PRIMARY KEY (run_id, batch_id)
) STRICT, WITHOUT ROWID;

CREATE TABLE capabilities (
	run_id        TEXT PRIMARY KEY REFERENCES runs (id) ON DELETE CASCADE,
	model         TEXT NOT NULL,
	state         TEXT NOT NULL CHECK (state IN ('active', 'revoked')),
	expires_at    INTEGER NOT NULL,
	max_requests  INTEGER NOT NULL,
	used_requests INTEGER NOT NULL
) STRICT;

-- position is the seq of the approval's approval.requested event, which
-- orders approvals that were requested at the same instant.
CREATE TABLE approvals (
	run_id       TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
	id           TEXT NOT NULL,
	position     INTEGER NOT NULL,
	tool         TEXT NOT NULL,
	arguments    BLOB,
	status       TEXT NOT NULL,
	decision     TEXT NOT NULL DEFAULT '',
	reason       TEXT NOT NULL DEFAULT '',
	decided_by   TEXT NOT NULL DEFAULT '',
	requested_at INTEGER,
	expires_at   INTEGER,
	decided_at   INTEGER,
	PRIMARY KEY (run_id, id)
) STRICT, WITHOUT ROWID;
`,
	// 2: the claim exchange: a run's attempt and the sandbox that claimed
	// it, and claim codes, kept only as their SHA-256.
	`
ALTER TABLE runs ADD COLUMN attempt INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN sandbox_ref TEXT NOT NULL DEFAULT '';

CREATE TABLE claims (
	code_hash  BLOB PRIMARY KEY,
	run_id     TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
	attempt    INTEGER NOT NULL,
	expires_at INTEGER NOT NULL,
	used_at    INTEGER
) STRICT, WITHOUT ROWID;
CREATE INDEX claims_run ON claims (run_id);
`,
	// 3: who wrote each event, and what a run's sandbox has appended, for
	// its caps.
	`
ALTER TABLE events ADD COLUMN source TEXT NOT NULL DEFAULT 'control';
ALTER TABLE runs ADD COLUMN sandbox_events INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN sandbox_event_bytes INTEGER NOT NULL DEFAULT 0;
`,
	// 4: checkpoints and resume: the run's latest checkpoint and the
	// attempts whose sandbox was lost (JSON).
	`
ALTER TABLE runs ADD COLUMN checkpoint TEXT;
ALTER TABLE runs ADD COLUMN lost_attempts TEXT;
`,
	// 5: webhook deliveries, so a redelivery is answered as the first was.
	`
CREATE TABLE deliveries (
	provider    TEXT NOT NULL,
	id          TEXT NOT NULL,
	run_id      TEXT NOT NULL DEFAULT '',
	ignored     TEXT NOT NULL DEFAULT '',
	received_at INTEGER NOT NULL,
	PRIMARY KEY (provider, id)
) STRICT, WITHOUT ROWID;
`,
	// 6: sessions: each one JSON document (its request, turns, usage and
	// head), rewritten whole by each change in one transaction.
	`
CREATE TABLE sessions (
	id         TEXT PRIMARY KEY,
	doc        TEXT NOT NULL,
	version    INTEGER NOT NULL,
	created_at INTEGER NOT NULL
) STRICT;

CREATE TABLE session_connections (
	id           TEXT PRIMARY KEY,
	session_id   TEXT NOT NULL,
	connected_at INTEGER NOT NULL,
	sent         INTEGER NOT NULL
) STRICT;
CREATE INDEX session_connections_session ON session_connections (session_id);
`,
	// 7: a run's request in a table of its own. The runs row is rewritten
	// by every event appended and every model call; with the request in it
	// (up to the whole uploaded tree) each of those writes read and
	// rewrote the request too, so their cost grew with the upload.
	`
CREATE TABLE run_requests (
	run_id  TEXT PRIMARY KEY REFERENCES runs (id) ON DELETE CASCADE,
	request TEXT NOT NULL
) STRICT;
INSERT INTO run_requests (run_id, request) SELECT id, request FROM runs;
ALTER TABLE runs DROP COLUMN request;
`,
}

// SchemaVersion is the schema version this code writes: the number of
// migrations. Open refuses a database with a newer one, written by a newer
// belay, rather than misread it.
const SchemaVersion = 7

// migrate brings the database to SchemaVersion in one write transaction,
// so a crash mid-migration leaves the old schema. It returns the version
// it found and the one it left.
func migrate(ctx context.Context, db *sql.DB) (from, to int, err error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, 0, fmt.Errorf("migrate: begin: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	if len(migrations) != SchemaVersion {
		return 0, 0, fmt.Errorf("migrate: %d migrations for schema version %d", len(migrations), SchemaVersion)
	}
	if err := tx.QueryRowContext(ctx, "PRAGMA user_version").Scan(&from); err != nil {
		return 0, 0, fmt.Errorf("migrate: read schema version: %w", err)
	}
	if from > len(migrations) {
		return from, from, fmt.Errorf("migrate: database schema version %d is newer than this belay knows (%d); use a newer belay", from, len(migrations))
	}
	for v := from; v < len(migrations); v++ {
		if _, err := tx.ExecContext(ctx, migrations[v]); err != nil {
			return from, v, fmt.Errorf("migrate: to schema version %d: %w", v+1, err)
		}
	}
	// PRAGMA takes no bound parameters; the version is an integer we own.
	if _, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", len(migrations))); err != nil {
		return from, from, fmt.Errorf("migrate: write schema version: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return from, from, fmt.Errorf("migrate: commit: %w", err)
	}
	return from, SchemaVersion, nil
}
