// Package sqlite is the embedded adapter for belay.Store: runs, event logs,
// capabilities and approvals in one SQLite database file under the data
// directory, through the pure-Go driver modernc.org/sqlite (no cgo).
//
// Each port method is one transaction, which gives the same atomicity the
// DynamoDB adapter gets from conditional writes and transactions: a state
// change and its events land together or not at all, a budget is spent by
// exactly one caller per request, and a terminal run never changes. The
// conformance suite in internal/storetest holds this adapter and the
// DynamoDB one to the same contract.
package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/belay-dev/belay/internal/belay"

	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver
)

// Options configures a Store.
type Options struct {
	// EventBufferSize is how many events each run keeps; older ones are
	// removed as new ones arrive. Zero means belay.DefaultEventBufferSize.
	EventBufferSize int
	// Logger receives the store's few log lines (opening, migrating). Nil
	// discards them. It never receives request contents or event data.
	Logger *slog.Logger
}

// Store is belay.Store on one SQLite database file.
//
// It holds two connection pools on the same file. Writes go through a pool
// of exactly one connection: SQLite admits one writer at a time anyway, and
// with a single connection concurrent writers queue in database/sql (in
// order, honouring their contexts) instead of racing for the file lock in
// SQLite's busy handler, which sleeps and retries and under load can still
// give up with SQLITE_BUSY. Each write transaction starts with BEGIN
// IMMEDIATE, so it holds the write lock from its first statement and its
// reads cannot go stale before it writes. busy_timeout remains for other
// processes that open the same file (a second belay, the sqlite3 shell).
// Reads go through a separate read-only pool: in WAL mode they see a
// consistent snapshot and neither block nor wait for the writer.
type Store struct {
	writer     *sql.DB
	reader     *sql.DB
	spend      *sql.Stmt // prepared once: ConsumeModelRequest is the model proxy's hot path
	calls      modelCallStmts
	bufferSize int
	log        *slog.Logger
}

var _ belay.Store = (*Store)(nil)

// busyTimeout is how long a connection waits for a lock another process
// holds before failing with SQLITE_BUSY.
const busyTimeout = 10 * time.Second

// Open opens (creating if needed) the database file at path, brings its
// schema up to date and returns the store. The file and its directory are
// created owner-only: the database holds run instructions and source files.
// Close releases it.
func Open(ctx context.Context, path string, opts Options) (*Store, error) {
	if path == "" || strings.ContainsAny(path, "?#") {
		return nil, fmt.Errorf("sqlite: open: database path %q must be a plain file name", path)
	}
	if opts.EventBufferSize < 0 {
		return nil, fmt.Errorf("sqlite: open: EventBufferSize %d is negative", opts.EventBufferSize)
	}
	s := &Store{bufferSize: opts.EventBufferSize, log: opts.Logger}
	if s.bufferSize == 0 {
		s.bufferSize = belay.DefaultEventBufferSize
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if err := createPrivateFile(path); err != nil {
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}

	writer, err := sql.Open("sqlite", dsn(path, false))
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	writer.SetMaxOpenConns(1)
	writer.SetMaxIdleConns(1)
	writer.SetConnMaxLifetime(0)
	writer.SetConnMaxIdleTime(0)
	s.writer = writer

	// The writer connects first and migrates, so the file is in WAL mode
	// and has its schema before any reader looks at it.
	from, to, err := migrate(ctx, writer)
	if err != nil {
		writer.Close()
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}

	if s.spend, err = writer.PrepareContext(ctx, spendSQL); err != nil {
		writer.Close()
		return nil, fmt.Errorf("sqlite: open %s: prepare: %w", path, err)
	}
	if s.calls, err = prepareModelCalls(ctx, writer); err != nil {
		writer.Close()
		return nil, fmt.Errorf("sqlite: open %s: prepare: %w", path, err)
	}

	reader, err := sql.Open("sqlite", dsn(path, true))
	if err != nil {
		writer.Close()
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	n := max(4, runtime.GOMAXPROCS(0))
	reader.SetMaxOpenConns(n)
	reader.SetMaxIdleConns(n)
	if err := reader.PingContext(ctx); err != nil {
		writer.Close()
		reader.Close()
		return nil, fmt.Errorf("sqlite: open %s: reader: %w", path, err)
	}
	s.reader = reader
	s.log.Info("sqlite store opened", "path", path, "schema_version", to, "migrated_from", from, "event_buffer", s.bufferSize)
	return s, nil
}

// Close closes both connection pools. The database file stays, with
// everything committed.
func (s *Store) Close() error {
	return errors.Join(s.spend.Close(), s.calls.close(), s.reader.Close(), s.writer.Close())
}

// dsn is the driver's data source name for path. Every connection gets
// WAL (readers and the writer do not block each other, and a commit
// appends to the log instead of rewriting pages), a busy timeout, foreign
// keys, and synchronous=NORMAL: in WAL mode that keeps every committed
// transaction across a crash of the process, and trades only the last
// transactions before a power loss for not syncing on every commit, which
// is SQLite's recommended setting for WAL. Writers begin IMMEDIATE; readers
// are query-only.
func dsn(path string, readOnly bool) string {
	q := url.Values{}
	q.Set("_busy_timeout", fmt.Sprint(busyTimeout.Milliseconds()))
	q.Set("_journal_mode", "WAL")
	q.Set("_foreign_keys", "1")
	q.Set("_synchronous", "NORMAL")
	if readOnly {
		q.Set("_query_only", "1")
	} else {
		q.Set("_txlock", "immediate")
	}
	return path + "?" + q.Encode()
}

// createPrivateFile makes sure path exists with mode 0600 in a directory
// that exists, creating the directory 0700 if needed. SQLite gives its
// -wal and -shm files the database file's mode.
func createPrivateFile(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	return f.Close()
}

// update runs fn in one write transaction (BEGIN IMMEDIATE on the single
// writer connection) and commits it when fn succeeds.
func (s *Store) update(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := s.writer.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	if err := fn(tx); err != nil {
		if rerr := tx.Rollback(); rerr != nil && !errors.Is(rerr, sql.ErrTxDone) {
			s.log.Error("sqlite rollback failed", "error", rerr)
		}
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// view runs fn in one read transaction, so everything it reads comes from
// one snapshot.
func (s *Store) view(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := s.reader.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return fmt.Errorf("begin read: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // read-only: nothing to keep or lose
	return fn(tx)
}

// querier is what both *sql.Tx and *sql.DB offer.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// minTime and maxTime bound the times the store can hold: it keeps them as
// Unix nanoseconds in an int64.
var (
	minTime = time.Unix(0, -1<<63).UTC()
	maxTime = time.Unix(0, 1<<63-1).UTC()
)

// checkTimes returns invalid when a non-zero time cannot be stored.
func checkTimes(field string, ts ...time.Time) error {
	for _, t := range ts {
		if !t.IsZero() && (t.Before(minTime) || t.After(maxTime)) {
			return belay.FieldErrorf(belay.CodeInvalid, field, "time %s is outside the years 1678–2262", t.UTC().Format(time.RFC3339))
		}
	}
	return nil
}

// nanos is a time as stored: Unix nanoseconds, or NULL for the zero time.
func nanos(t time.Time) sql.NullInt64 {
	if t.IsZero() {
		return sql.NullInt64{}
	}
	return sql.NullInt64{Int64: t.UnixNano(), Valid: true}
}

// fromNanos is the inverse of nanos; times come back in UTC.
func fromNanos(n sql.NullInt64) time.Time {
	if !n.Valid {
		return time.Time{}
	}
	return time.Unix(0, n.Int64).UTC()
}

// wrap adds the operation to err. belay errors keep their code and
// message through the wrapping.
func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("sqlite: %s: %w", op, err)
}
