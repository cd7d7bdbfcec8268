package s3

// SetPageSize makes ListArtifacts ask for pages of n keys, so tests see it
// follow continuation tokens without writing a thousand objects.
func SetPageSize(s *Store, n int32) { s.pageSize = n }
