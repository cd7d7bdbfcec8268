#!/usr/bin/env bash
# deploy.sh — deploy belay to the AWS account of the current credentials
# (make deploy runs it after make build).
#
#   1. builds the sandbox image without Docker (scripts/image.sh): for
#      arm64 (Graviton Fargate) where this machine can run arm64 programs
#      (natively, or through qemu-user-static and binfmt_misc), else for this
#      machine's architecture; the task definition follows what was built;
#   2. pushes it to the stack's ECR repository with go-containerregistry
#      (infra/imagepush; no Docker daemon), under a tag made from its digest;
#   3. deploys the stack with the task definition pinned to that digest
#      (context sandboxImageDigest and sandboxArch).
# On the first deploy the repository does not exist yet: the stack is
# deployed first (pinned to the digest computed before the push), then the
# image pushed. Later deploys push first, so no task ever names an image
# that is not there.
#
# Environment: AWS credentials and region as for the AWS CLI (AWS_PROFILE,
# AWS_REGION, ...); CDK_ARGS adds arguments to cdk deploy (for example
# "-c azCount=1 --require-approval never"); BELAY_IMAGE_ARCH forces the
# image architecture (arm64 or amd64).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
stack=Belay
say() { echo "deploy: $*" >&2; }

if [[ ! -f scripts/image.sh ]]; then
	say "scripts/image.sh is missing: this checkout cannot build the sandbox image yet"
	exit 1
fi
arch=${BELAY_IMAGE_ARCH:-arm64}
archive=bin/belay-sandbox-$arch.oci.tar
say "building the sandbox image for $arch"
if ! BELAY_IMAGE_ARCH=$arch scripts/image.sh "$archive"; then
	if [[ -z ${BELAY_IMAGE_ARCH:-} && $arch != "$(dpkg --print-architecture)" ]]; then
		arch=$(dpkg --print-architecture)
		archive=bin/belay-sandbox-$arch.oci.tar
		say "this machine cannot build arm64; building for $arch instead (the task definition will say $arch)"
		BELAY_IMAGE_ARCH=$arch scripts/image.sh "$archive"
	else
		exit 1
	fi
fi
read -r digest built_arch < <(go run ./infra/imagepush digest "$archive")
say "image $digest ($built_arch)"

context=(-c "sandboxImageDigest=$digest" -c "sandboxArch=$built_arch")
# shellcheck disable=SC2206 # CDK_ARGS is a list of words on purpose
extra=(${CDK_ARGS:-})
if go run ./infra/imagepush repo "$stack" >/dev/null 2>&1; then
	say "pushing to the existing repository"
	go run ./infra/imagepush push "$stack" "$archive"
	scripts/cdk.sh deploy "$stack" "${context[@]}" --outputs-file cdk.out/outputs.json "${extra[@]}"
else
	say "first deploy: the stack (and its repository), then the image"
	scripts/cdk.sh deploy "$stack" "${context[@]}" --outputs-file cdk.out/outputs.json "${extra[@]}"
	go run ./infra/imagepush push "$stack" "$archive"
fi
say "done; the outputs are in cdk.out/outputs.json. Next: put the provider key (README, Deploy)."
