#!/usr/bin/env bash
# test.sh [bench] — run the suite against real peers, and always stop them.
#
#   scripts/test.sh        go test ./... then every fuzz target (scripts/fuzz.sh),
#                          then the sandbox image built a second time: same digest
#   scripts/test.sh bench  the benchmarks only (BENCHTIME, default 1s)
#
# Both first build the sandbox image once (scripts/image.sh) and share it
# with every test that runs it: BELAY_TEST_SANDBOX_IMAGE names the archive,
# BELAY_TEST_SANDBOX_CACHE a folder where it is unpacked once. Where it
# cannot be built (not root, no mmdebstrap or umoci) those tests skip,
# outside CI; under CI=true that is a failure.
#
# Each run starts its own DynamoDB Local in a private state directory, so two
# runs in one checkout do not share tables or stop each other's peer; the trap
# stops it however the run ends (failure, Ctrl-C, kill).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
mode=${1:-test}

mkdir -p .peers
BELAY_PEERS_DIR=$(mktemp -d "$root/.peers/run.XXXXXX")
export BELAY_PEERS_DIR
image_cache=""
cleanup() {
	scripts/peers.sh stop || true
	rm -rf "$BELAY_PEERS_DIR"
	[[ -z $image_cache ]] || rm -rf "$image_cache"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# An assignment, not eval "$(...)": a failed start must stop the run.
exports=$(scripts/peers.sh start)
eval "$exports"
echo "test: BELAY_TEST_DYNAMODB_ENDPOINT=$BELAY_TEST_DYNAMODB_ENDPOINT"

image_dir=$BELAY_PEERS_DIR/image
mkdir -m 0700 "$image_dir"
image_status=0
image_digest=""
if [[ $(id -u) -ne 0 ]] || ! command -v mmdebstrap >/dev/null 2>&1 || ! command -v umoci >/dev/null 2>&1; then
	echo "test: cannot build the sandbox image here (it needs root, mmdebstrap and umoci: apt-get install mmdebstrap umoci runc); the tests that run it skip" >&2
	[[ -n ${CI:-} ]] && image_status=1
else
	start=$(date +%s)
	if image_digest=$(scripts/image.sh "$image_dir/belay-sandbox.oci.tar"); then
		export BELAY_TEST_SANDBOX_IMAGE=$image_dir/belay-sandbox.oci.tar
		# Each sandbox's user namespace root (an unprivileged host id)
		# mounts the image from the cache, so every folder above it must
		# be searchable by others; the checkout (and $BELAY_PEERS_DIR,
		# 0700) may not be: the cache lives in /tmp, root's, 0711.
		image_cache=$(mktemp -d /tmp/belay-image-cache.XXXXXX)
		chmod 0711 "$image_cache"
		export BELAY_TEST_SANDBOX_CACHE=$image_cache/images
		echo "test: BELAY_TEST_SANDBOX_IMAGE=$BELAY_TEST_SANDBOX_IMAGE ($image_digest, built in $(($(date +%s) - start)) s)"
	else
		echo "test: building the sandbox image failed" >&2
		image_status=1
	fi
fi

case $mode in
test)
	status=$image_status
	go test -count=1 -timeout 15m ./... || status=$?
	# Fuzz even after a failure, so one run reports everything it can.
	scripts/fuzz.sh || status=1
	# make image twice gives the same image: build it again from the same
	# inputs and compare the digests and the archives' bytes.
	if [[ -n $image_digest ]]; then
		if again=$(scripts/image.sh "$image_dir/again.oci.tar") && [[ $again == "$image_digest" ]] &&
			cmp -s "$BELAY_TEST_SANDBOX_IMAGE" "$image_dir/again.oci.tar"; then
			echo "test: ok  the sandbox image is reproducible: $image_digest from both builds, the archives identical"
		else
			echo "test: FAIL the sandbox image is not reproducible: $image_digest, then ${again:-a failed build}" >&2
			status=1
		fi
	fi
	exit "$status"
	;;
bench)
	status=$image_status
	go test -count=1 -timeout 30m -run '^$' -bench . -benchmem -benchtime "${BENCHTIME:-1s}" ./... || status=$?
	exit "$status"
	;;
*)
	echo "usage: $0 [bench]" >&2
	exit 2
	;;
esac
