// Package s3 is the AWS deployment's belay.ArtifactStore: each run's
// artifacts are objects <prefix>runs/<runId>/<name> in one bucket. It also
// presigns the PUT and GET URLs the Fargate sandbox uses, so the sandbox
// reaches its own run's objects through the S3 gateway endpoint without
// holding any AWS credentials.
//
// Run ids and names follow the same rules as the embedded folder store
// (internal/localdir); internal/artifacttest holds both to one contract.
package s3

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/belay-dev/belay/internal/belay"
)

const (
	// MaxPresignTTL is the longest a SigV4 presigned URL may live.
	MaxPresignTTL = 7 * 24 * time.Hour
	// MaxBytesMetadata is the user-metadata key (sent as the
	// x-amz-meta-belay-max-bytes header) in which a presigned PUT records
	// the upload's size cap. S3 cannot bound the body of a presigned PUT,
	// but the header is signed, so the uploader cannot change it, and
	// GetArtifact refuses an object larger than the cap it carries.
	MaxBytesMetadata = "belay-max-bytes"
)

// Store keeps artifacts in an S3 bucket. It is safe for concurrent use.
type Store struct {
	client  *awss3.Client
	presign *awss3.PresignClient
	bucket  string
	prefix  string
	// pageSize bounds ListObjectsV2 pages; zero leaves it to S3 (1,000).
	pageSize int32
}

var _ belay.ArtifactStore = (*Store)(nil)

// New returns a store for bucket whose keys all start with prefix (for
// example "" or "belay/"), so several deployments can share a bucket.
func New(client *awss3.Client, bucket, prefix string) *Store {
	return &Store{
		client:  client,
		presign: awss3.NewPresignClient(client),
		bucket:  bucket,
		prefix:  prefix,
	}
}

// NewLocalClient returns a client for an S3-compatible peer on this machine
// (gofakes3 in tests): static dummy credentials, path-style addressing,
// us-east-1, and no shared AWS configuration read from the environment.
// Response checksum validation stays on: this SDK only notes a response
// without a checksum at debug level, so there is no warning to silence.
func NewLocalClient(endpoint string) *awss3.Client {
	return awss3.New(awss3.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(endpoint),
		UsePathStyle: true,
		Credentials:  credentials.NewStaticCredentialsProvider("belay-local", "belay-local-secret", ""),
	})
}

// Key returns the object key of an artifact, for operators and tests that
// look into the bucket directly.
func (s *Store) Key(runID, name string) string {
	return s.runPrefix(runID) + name
}

func (s *Store) runPrefix(runID string) string {
	return s.prefix + "runs/" + runID + "/"
}

// PutArtifact stores content as one object, replacing any earlier one (S3
// replaces objects atomically). Returns invalid for a bad run id or name;
// too_large over belay.MaxArtifactBytes, without calling S3.
func (s *Store) PutArtifact(ctx context.Context, runID, name string, content []byte) error {
	if err := belay.CheckArtifactPut(runID, name, content); err != nil {
		return err
	}
	_, err := s.client.PutObject(ctx, &awss3.PutObjectInput{
		Bucket:        aws.String(s.bucket),
		Key:           aws.String(s.Key(runID, name)),
		Body:          bytes.NewReader(content),
		ContentLength: aws.Int64(int64(len(content))),
		ContentType:   aws.String("application/octet-stream"),
	})
	if err != nil {
		return fmt.Errorf("s3: put artifact %s/%s: %w", runID, name, err)
	}
	return nil
}

// GetArtifact returns an object's content, reading no more than its cap:
// belay.MaxArtifactBytes, or the smaller cap a presigned PUT recorded.
// Returns invalid for a bad run id or name; not_found if the object does
// not exist; too_large if it is over its cap.
func (s *Store) GetArtifact(ctx context.Context, runID, name string) ([]byte, error) {
	if err := belay.CheckArtifact(runID, name); err != nil {
		return nil, err
	}
	out, err := s.client.GetObject(ctx, &awss3.GetObjectInput{
		Bucket: aws.String(s.bucket),
		Key:    aws.String(s.Key(runID, name)),
	})
	if err != nil {
		if _, ok := errors.AsType[*types.NoSuchKey](err); ok {
			return nil, belay.Errorf(belay.CodeNotFound, "artifact %s not found", name)
		}
		return nil, fmt.Errorf("s3: get artifact %s/%s: %w", runID, name, err)
	}
	defer out.Body.Close()
	limit := int64(belay.MaxArtifactBytes)
	if v, ok := out.Metadata[MaxBytesMetadata]; ok {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("s3: get artifact %s/%s: malformed %s metadata", runID, name, MaxBytesMetadata)
		}
		limit = min(limit, n)
	}
	if out.ContentLength != nil && *out.ContentLength > limit {
		return nil, belay.Errorf(belay.CodeTooLarge, "artifact %s is %d bytes; the limit is %d", name, *out.ContentLength, limit)
	}
	content, err := io.ReadAll(io.LimitReader(out.Body, limit+1))
	if err != nil {
		return nil, fmt.Errorf("s3: read artifact %s/%s: %w", runID, name, err)
	}
	if int64(len(content)) > limit {
		return nil, belay.Errorf(belay.CodeTooLarge, "artifact %s is larger than %d bytes", name, limit)
	}
	return content, nil
}

// ListArtifacts returns the run's artifacts sorted by name, following every
// page; an empty list when it has none. Returns invalid for a bad run id.
func (s *Store) ListArtifacts(ctx context.Context, runID string) ([]belay.ArtifactInfo, error) {
	if err := belay.CheckArtifactRunID(runID); err != nil {
		return nil, err
	}
	prefix := s.runPrefix(runID)
	in := &awss3.ListObjectsV2Input{
		Bucket: aws.String(s.bucket),
		Prefix: aws.String(prefix),
	}
	if s.pageSize > 0 {
		in.MaxKeys = aws.Int32(s.pageSize)
	}
	list := []belay.ArtifactInfo{}
	pages := awss3.NewListObjectsV2Paginator(s.client, in)
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("s3: list artifacts of %s: %w", runID, err)
		}
		for _, o := range page.Contents {
			name := strings.TrimPrefix(aws.ToString(o.Key), prefix)
			if belay.CheckArtifactName(name) != nil {
				continue // not an artifact this store wrote
			}
			list = append(list, belay.ArtifactInfo{Name: name, Size: aws.ToInt64(o.Size)})
		}
	}
	slices.SortFunc(list, func(a, b belay.ArtifactInfo) int { return strings.Compare(a.Name, b.Name) })
	return list, nil
}

// DeleteArtifact removes the object; S3 answers a delete of a missing key
// with success too. Returns invalid for a bad run id or name.
func (s *Store) DeleteArtifact(ctx context.Context, runID, name string) error {
	if err := belay.CheckArtifact(runID, name); err != nil {
		return err
	}
	_, err := s.client.DeleteObject(ctx, &awss3.DeleteObjectInput{
		Bucket: aws.String(s.bucket),
		Key:    aws.String(s.Key(runID, name)),
	})
	if err != nil {
		return fmt.Errorf("s3: delete artifact %s/%s: %w", runID, name, err)
	}
	return nil
}

// PresignPut returns a URL, valid for ttl, with which the sandbox uploads
// one artifact by plain HTTP PUT, and the headers it must send with it
// (they are signed). maxBytes (1 to belay.MaxArtifactBytes) is recorded in
// a signed metadata header: S3 cannot refuse a presigned PUT for its size,
// so GetArtifact refuses an object larger than this cap instead. Returns
// invalid for a bad run id, name, ttl or maxBytes.
func (s *Store) PresignPut(ctx context.Context, runID, name string, ttl time.Duration, maxBytes int64) (url string, headers http.Header, err error) {
	if err := checkPresign(runID, name, ttl); err != nil {
		return "", nil, err
	}
	if maxBytes < 1 || maxBytes > belay.MaxArtifactBytes {
		return "", nil, belay.FieldErrorf(belay.CodeInvalid, "maxBytes", "must be 1 to %d", belay.MaxArtifactBytes)
	}
	req, err := s.presign.PresignPutObject(ctx, &awss3.PutObjectInput{
		Bucket:      aws.String(s.bucket),
		Key:         aws.String(s.Key(runID, name)),
		ContentType: aws.String("application/octet-stream"),
		Metadata:    map[string]string{MaxBytesMetadata: strconv.FormatInt(maxBytes, 10)},
	}, awss3.WithPresignExpires(ttl))
	if err != nil {
		return "", nil, fmt.Errorf("s3: presign put %s/%s: %w", runID, name, err)
	}
	return req.URL, uploadHeaders(req.SignedHeader), nil
}

// PresignGet returns a URL, valid for ttl, from which one artifact can be
// downloaded by plain HTTP GET. Returns invalid for a bad run id, name or
// ttl.
func (s *Store) PresignGet(ctx context.Context, runID, name string, ttl time.Duration) (string, error) {
	if err := checkPresign(runID, name, ttl); err != nil {
		return "", err
	}
	req, err := s.presign.PresignGetObject(ctx, &awss3.GetObjectInput{
		Bucket: aws.String(s.bucket),
		Key:    aws.String(s.Key(runID, name)),
	}, awss3.WithPresignExpires(ttl))
	if err != nil {
		return "", fmt.Errorf("s3: presign get %s/%s: %w", runID, name, err)
	}
	return req.URL, nil
}

// uploadHeaders drops Host from the signed headers: an HTTP client derives
// it from the URL, and net/http ignores it in a header map anyway.
func uploadHeaders(signed http.Header) http.Header {
	h := signed.Clone()
	h.Del("Host")
	return h
}

func checkPresign(runID, name string, ttl time.Duration) error {
	if err := belay.CheckArtifact(runID, name); err != nil {
		return err
	}
	if ttl < time.Second || ttl > MaxPresignTTL {
		return belay.FieldErrorf(belay.CodeInvalid, "ttl", "must be 1s to %s", MaxPresignTTL)
	}
	return nil
}
