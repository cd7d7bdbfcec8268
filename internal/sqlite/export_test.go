package sqlite

// DSN exposes the data source name the store uses, so benchmarks can time a
// bare transaction on a connection configured exactly like the store's.
var DSN = dsn
