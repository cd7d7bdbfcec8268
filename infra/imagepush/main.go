// Command imagepush puts the sandbox image into the stack's ECR repository
// without a Docker daemon (go-containerregistry), for scripts/deploy.sh:
//
//	imagepush digest ARCHIVE          print the image's digest and architecture
//	imagepush repo STACK              print the stack's SandboxRepositoryUri (exit 3: no stack yet)
//	imagepush push STACK ARCHIVE      push the image to that repository, print its digest
//
// ARCHIVE is an OCI image layout packed as a tar (what make image writes,
// bin/belay-sandbox.oci.tar) holding one image. The image keeps its digest
// (its manifest is pushed as it is), so the task definition can pin the
// digest computed before the push. AWS credentials and region come from the
// default chain (AWS_PROFILE, AWS_REGION, ...).
package main

import (
	"archive/tar"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/cloudformation"
	"github.com/aws/aws-sdk-go-v2/service/ecr"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// errNoStack is the answer of repo when the stack (or its output) does
// not exist yet: the first deploy creates the repository.
var errNoStack = errors.New("no such stack output")

func main() {
	ctx := context.Background()
	err := run(ctx, os.Args[1:], os.Stdout)
	switch {
	case err == nil:
	case errors.Is(err, errNoStack):
		fmt.Fprintln(os.Stderr, "imagepush:", err)
		os.Exit(3)
	default:
		fmt.Fprintln(os.Stderr, "imagepush:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, out io.Writer) error {
	usage := errors.New("usage: imagepush digest ARCHIVE | repo STACK | push STACK ARCHIVE")
	if len(args) == 0 {
		return usage
	}
	switch {
	case args[0] == "digest" && len(args) == 2:
		img, cleanup, err := openArchive(args[1])
		if err != nil {
			return err
		}
		defer cleanup()
		d, arch, err := describe(img)
		if err != nil {
			return err
		}
		fmt.Fprintln(out, d, arch)
		return nil
	case args[0] == "repo" && len(args) == 2:
		uri, err := repositoryURI(ctx, args[1])
		if err != nil {
			return err
		}
		fmt.Fprintln(out, uri)
		return nil
	case args[0] == "push" && len(args) == 3:
		uri, err := repositoryURI(ctx, args[1])
		if err != nil {
			return err
		}
		auth, err := ecrAuth(ctx)
		if err != nil {
			return err
		}
		img, cleanup, err := openArchive(args[2])
		if err != nil {
			return err
		}
		defer cleanup()
		d, err := push(ctx, img, uri, auth)
		if err != nil {
			return err
		}
		fmt.Fprintln(out, d)
		return nil
	}
	return usage
}

// openArchive unpacks an OCI layout tar into a temporary folder and returns
// its one image.
func openArchive(path string) (v1.Image, func(), error) {
	dir, err := os.MkdirTemp("", "imagepush-")
	if err != nil {
		return nil, nil, err
	}
	cleanup := func() { _ = os.RemoveAll(dir) }
	if err := untar(path, dir); err != nil {
		cleanup()
		return nil, nil, fmt.Errorf("unpack %s: %w", path, err)
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		cleanup()
		return nil, nil, fmt.Errorf("%s is not an OCI image layout: %w", path, err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	if len(m.Manifests) != 1 {
		cleanup()
		return nil, nil, fmt.Errorf("%s holds %d images; want exactly one", path, len(m.Manifests))
	}
	img, err := idx.Image(m.Manifests[0].Digest)
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	return img, cleanup, nil
}

// untar extracts regular files and folders only, refusing paths that
// would leave dir.
func untar(path, dir string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		clean := filepath.Clean(h.Name)
		if filepath.IsAbs(clean) || clean == ".." || strings.HasPrefix(clean, "../") {
			return fmt.Errorf("entry %q leaves the archive", h.Name)
		}
		target := filepath.Join(dir, clean)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return err
			}
			w, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
			if err != nil {
				return err
			}
			if _, err := io.Copy(w, tr); err != nil {
				w.Close()
				return err
			}
			if err := w.Close(); err != nil {
				return err
			}
		}
	}
}

// describe returns the image's manifest digest and its architecture as
// the task definition names it (arm64 or amd64).
func describe(img v1.Image) (string, string, error) {
	d, err := img.Digest()
	if err != nil {
		return "", "", err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return "", "", err
	}
	if cfg.OS != "linux" || (cfg.Architecture != "arm64" && cfg.Architecture != "amd64") {
		return "", "", fmt.Errorf("the image is for %s/%s; Fargate runs linux/arm64 or linux/amd64", cfg.OS, cfg.Architecture)
	}
	return d.String(), cfg.Architecture, nil
}

// push writes img to repository (host/path) under a tag made from its
// digest (the repository's tags are immutable), and returns the digest.
func push(ctx context.Context, img v1.Image, repository string, auth authn.Authenticator, opts ...name.Option) (string, error) {
	d, err := img.Digest()
	if err != nil {
		return "", err
	}
	ref, err := name.NewTag(repository+":sandbox-"+d.Hex[:16], opts...)
	if err != nil {
		return "", fmt.Errorf("repository %q: %w", repository, err)
	}
	if err := remote.Write(ref, img, remote.WithAuth(auth), remote.WithContext(ctx)); err != nil {
		return "", fmt.Errorf("push to %s: %w", ref, err)
	}
	return d.String(), nil
}

// repositoryURI reads the stack's SandboxRepositoryUri output.
func repositoryURI(ctx context.Context, stack string) (string, error) {
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		return "", fmt.Errorf("AWS configuration: %w", err)
	}
	out, err := cloudformation.NewFromConfig(cfg).DescribeStacks(ctx, &cloudformation.DescribeStacksInput{StackName: aws.String(stack)})
	if err != nil {
		if strings.Contains(err.Error(), "does not exist") {
			return "", fmt.Errorf("stack %s: %w", stack, errNoStack)
		}
		return "", fmt.Errorf("describe stack %s: %w", stack, err)
	}
	for _, s := range out.Stacks {
		for _, o := range s.Outputs {
			if aws.ToString(o.OutputKey) == "SandboxRepositoryUri" {
				return aws.ToString(o.OutputValue), nil
			}
		}
	}
	return "", fmt.Errorf("stack %s has no SandboxRepositoryUri output: %w", stack, errNoStack)
}

// ecrAuth turns an ECR authorization token into registry credentials.
func ecrAuth(ctx context.Context) (authn.Authenticator, error) {
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		return nil, fmt.Errorf("AWS configuration: %w", err)
	}
	out, err := ecr.NewFromConfig(cfg).GetAuthorizationToken(ctx, &ecr.GetAuthorizationTokenInput{})
	if err != nil {
		return nil, fmt.Errorf("ECR authorization token: %w", err)
	}
	if len(out.AuthorizationData) == 0 {
		return nil, errors.New("ECR returned no authorization data")
	}
	return basicFromToken(aws.ToString(out.AuthorizationData[0].AuthorizationToken))
}

// basicFromToken decodes ECR's token, base64 of "user:password".
func basicFromToken(token string) (authn.Authenticator, error) {
	raw, err := base64.StdEncoding.DecodeString(token)
	if err != nil {
		return nil, fmt.Errorf("ECR token is not base64: %w", err)
	}
	user, pass, ok := strings.Cut(string(raw), ":")
	if !ok || user == "" || pass == "" {
		return nil, errors.New("ECR token is not user:password")
	}
	return &authn.Basic{Username: user, Password: pass}, nil
}
