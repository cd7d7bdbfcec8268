package sqlite

import (
	"context"
	"database/sql"
)

// DSN exposes the data source name the store uses, so benchmarks can time a
// bare transaction on a connection configured exactly like the store's.
var DSN = dsn

// EmptyWrite runs an empty write transaction (BEGIN IMMEDIATE; COMMIT) on
// the store's own writer connection: the floor a store write is read
// against.
func EmptyWrite(s *Store, ctx context.Context) error {
	return s.update(ctx, func(*sql.Tx) error { return nil })
}

// OneRowWrite runs a write transaction that changes one row: it adds one
// to the run's capability count, so SQLite has one page to log and
// commit. (A statement that rewrites a row as it is changes no page, and
// costs about what an empty transaction does.) It is the least any write
// that records something costs.
func OneRowWrite(s *Store, ctx context.Context, runID string) error {
	return s.update(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "UPDATE capabilities SET used_requests = used_requests + 1 WHERE run_id = ?", runID)
		return err
	})
}

// MigrationsTo returns the schema steps up to version v, to build a
// database as an older belay left it.
func MigrationsTo(v int) []string { return migrations[:v] }
