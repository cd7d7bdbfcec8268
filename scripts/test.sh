#!/usr/bin/env bash
# test.sh [bench] — run the suite against real peers, and always stop them.
#
#   scripts/test.sh        go test ./... then every fuzz target (scripts/fuzz.sh)
#   scripts/test.sh bench  the benchmarks only (BENCHTIME, default 1s)
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
cleanup() {
	scripts/peers.sh stop || true
	rm -rf "$BELAY_PEERS_DIR"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# An assignment, not eval "$(...)": a failed start must stop the run.
exports=$(scripts/peers.sh start)
eval "$exports"
echo "test: BELAY_TEST_DYNAMODB_ENDPOINT=$BELAY_TEST_DYNAMODB_ENDPOINT"

case $mode in
test)
	status=0
	go test -count=1 -timeout 15m ./... || status=$?
	# Fuzz even after a failure, so one run reports everything it can.
	scripts/fuzz.sh || status=1
	exit "$status"
	;;
bench)
	go test -count=1 -timeout 30m -run '^$' -bench . -benchmem -benchtime "${BENCHTIME:-1s}" ./...
	;;
*)
	echo "usage: $0 [bench]" >&2
	exit 2
	;;
esac
