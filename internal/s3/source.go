package s3

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/aws/aws-sdk-go-v2/aws"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/belay-dev/belay/internal/belay"
)

var _ belay.SourceStore = (*Store)(nil)

// PutSource spools r to a temporary file (counting and hashing it, and
// refusing it past maxBytes before anything reaches S3), then puts it as
// the object runs/<runId>/source.bundle from that seekable file. Returns
// invalid for a bad run id; too_large past maxBytes.
func (s *Store) PutSource(ctx context.Context, runID string, r io.Reader, maxBytes int64) (belay.SourceBundle, error) {
	if err := belay.CheckArtifactRunID(runID); err != nil {
		return belay.SourceBundle{}, err
	}
	tmp, err := os.CreateTemp("", "belay-source-*.bundle")
	if err != nil {
		return belay.SourceBundle{}, fmt.Errorf("s3: put source of %s: %w", runID, err)
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), io.LimitReader(r, maxBytes+1))
	switch {
	case err != nil:
		return belay.SourceBundle{}, fmt.Errorf("s3: put source of %s: %w", runID, err)
	case n > maxBytes:
		return belay.SourceBundle{}, belay.Errorf(belay.CodeTooLarge, "the source bundle is larger than %d bytes", maxBytes)
	}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return belay.SourceBundle{}, fmt.Errorf("s3: put source of %s: %w", runID, err)
	}
	_, err = s.client.PutObject(ctx, &awss3.PutObjectInput{
		Bucket:        aws.String(s.bucket),
		Key:           aws.String(s.Key(runID, belay.SourceBundleName)),
		Body:          tmp,
		ContentLength: aws.Int64(n),
		ContentType:   aws.String("application/x-git-bundle"),
	})
	if err != nil {
		return belay.SourceBundle{}, fmt.Errorf("s3: put source of %s: %w", runID, err)
	}
	return belay.SourceBundle{Size: n, SHA256: hex.EncodeToString(h.Sum(nil))}, nil
}

// OpenSource opens the object runs/<runId>/source.bundle. Returns invalid
// for a bad run id; not_found if it does not exist.
func (s *Store) OpenSource(ctx context.Context, runID string) (io.ReadCloser, int64, error) {
	if err := belay.CheckArtifactRunID(runID); err != nil {
		return nil, 0, err
	}
	out, err := s.client.GetObject(ctx, &awss3.GetObjectInput{
		Bucket: aws.String(s.bucket),
		Key:    aws.String(s.Key(runID, belay.SourceBundleName)),
	})
	if err != nil {
		if _, ok := errors.AsType[*types.NoSuchKey](err); ok {
			return nil, 0, belay.Errorf(belay.CodeNotFound, "run %s has no source bundle", runID)
		}
		return nil, 0, fmt.Errorf("s3: open source of %s: %w", runID, err)
	}
	return out.Body, aws.ToInt64(out.ContentLength), nil
}
