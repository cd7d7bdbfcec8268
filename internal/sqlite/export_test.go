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

// OneRowWrite runs a write transaction that rewrites one row of the run's
// capability as it is: one write, the unit a consume is "near the cost of".
func OneRowWrite(s *Store, ctx context.Context, runID string) error {
	return s.update(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "UPDATE capabilities SET used_requests = used_requests WHERE run_id = ?", runID)
		return err
	})
}

// MigrationsTo returns the schema steps up to version v, to build a
// database as an older belay left it.
func MigrationsTo(v int) []string { return migrations[:v] }
