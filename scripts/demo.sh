#!/usr/bin/env bash
# demo.sh — belay's main job, end to end on the embedded default.
#
# Starts `belay serve` (SQLite store, in-process orchestrator, the sandbox
# as the sandbox image under runc with the Fargate task's hardening: the
# OCI launcher, which needs root, runc and bin/belay-sandbox.oci.tar from
# make image) on a free loopback port with a fresh data directory, submits
# examples/calc (a failing pytest test) through the CLI,
# follows the run's events live, prints the check results and the patch,
# and stops everything it started.
#
# Offline by default: the model is a scripted session
# (examples/sessions/fix-calc.json), a deterministic stand-in served on
# loopback behind belay's model proxy. To use a real OpenAI-compatible
# provider instead, set BELAY_MODEL_API_URL, BELAY_MODEL and
# BELAY_MODEL_API_KEY (or BELAY_MODEL_API_KEY_FILE).
#
# BELAY_DEMO_KEEP=1 keeps the data directory (database, artifacts, logs).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
say() { printf '\n\033[1mdemo: %s\033[0m\n' "$*"; }

[[ -x bin/belay ]] || { echo "demo: bin/belay is missing; run make build (make demo does)" >&2; exit 1; }
if [[ ${BELAY_LAUNCHER:-oci} == oci ]]; then
	[[ -f bin/belay-sandbox.oci.tar ]] || { echo "demo: bin/belay-sandbox.oci.tar is missing; run make image (make demo does)" >&2; exit 1; }
elif ! /usr/bin/python3 -m pytest --version >/dev/null 2>&1; then
	# The process launcher runs the checks with the host's Python.
	echo "demo: the sandbox's checks use /usr/bin/python3 with pytest; install it: apt-get install python3-pytest" >&2
	exit 1
fi

# Not under /tmp: the process launcher refuses sandbox workspaces below a
# folder a sandbox can write (a run could plant a conftest.py there for
# later runs). As root under /var/lib, which the sandbox uids can pass
# through (a home directory is often 0700); otherwise in this user's
# runtime or cache directory.
if [[ $(id -u) -eq 0 ]]; then
	base=/var/lib
else
	base=${XDG_RUNTIME_DIR:-$HOME/.cache}
	mkdir -p "$base"
fi
data=$(mktemp -d "$base/belay-demo.XXXXXX")
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export BELAY_DATA_DIR=$data
export BELAY_ADDR=127.0.0.1:$port
export BELAY_ENDPOINT=http://127.0.0.1:$port
unset BELAY_TOKEN # the CLI reads the token belay serve writes into the data directory

if [[ -n ${BELAY_MODEL_API_URL:-} ]]; then
	: "${BELAY_MODEL:?set BELAY_MODEL to the model name at that provider}"
	# Bedrock signs with the AWS credentials; the others need a key.
	if [[ ${BELAY_MODEL_PROVIDER:-openai} != bedrock && -z ${BELAY_MODEL_API_KEY:-} && -z ${BELAY_MODEL_API_KEY_FILE:-} ]]; then
		echo "demo: BELAY_MODEL_API_URL is set; set BELAY_MODEL_API_KEY or BELAY_MODEL_API_KEY_FILE too" >&2
		exit 1
	fi
	say "model: $BELAY_MODEL at $BELAY_MODEL_API_URL (a real provider)"
else
	export BELAY_MODEL=${BELAY_MODEL:-scripted-fix-calc}
	export BELAY_SCRIPTED_MODEL=$root/examples/sessions/fix-calc.json
	say "model: scripted session examples/sessions/fix-calc.json in the ${BELAY_MODEL_PROVIDER:-openai} wire format (offline; set BELAY_MODEL_API_URL for a real provider)"
fi

server=""
cleanup() {
	status=$?
	if [[ -n $server ]] && kill -0 "$server" 2>/dev/null; then
		kill -TERM "$server" 2>/dev/null || true
		for _ in $(seq 1 100); do kill -0 "$server" 2>/dev/null || break; sleep 0.1; done
		kill -KILL "$server" 2>/dev/null || true
	fi
	if [[ $status -ne 0 && -f $data/serve.log ]]; then
		echo "demo: the server's log (last lines):" >&2
		tail -n 20 "$data/serve.log" >&2
	fi
	if [[ ${BELAY_DEMO_KEEP:-} == 1 ]]; then
		echo "demo: kept $data"
	else
		rm -rf "$data"
	fi
	exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

say "starting belay serve on $BELAY_ADDR (data in $data)"
bin/belay serve >"$data/serve.log" 2>&1 &
server=$!
# The OCI launcher unpacks the sandbox image once per data directory
# before belay serve listens: a few seconds on an idle machine, more on a
# busy one.
[[ ${BELAY_LAUNCHER:-oci} == oci ]] && echo "demo: unpacking the sandbox image into the fresh data directory first"
for i in $(seq 1 1800); do
	if bin/belay runs >/dev/null 2>&1; then break; fi
	kill -0 "$server" 2>/dev/null || { echo "demo: belay serve exited during start-up" >&2; exit 1; }
	[[ $i -eq 1800 ]] && { echo "demo: belay serve did not answer within 3 minutes" >&2; exit 1; }
	sleep 0.1
done
# What isolation each sandbox gets: belay serve's own list (printed just
# after it starts serving), and the launcher's warning when it could not
# apply all of it.
for _ in $(seq 1 20); do grep -q '^  isolation:' "$data/serve.log" && break; sleep 0.1; done
grep -E '^  (launcher|image|sandbox|WARNING): ' "$data/serve.log" || true
awk '/^  (isolation|not applied):/ {p = 1; print; next} p && /^    - / {print; next} {p = 0}' "$data/serve.log"
grep -o '"msg":"local sandbox: [^"]*"' "$data/serve.log" | sed 's/^"msg":"/  warning: /; s/"$//' || true

say "belay run examples/calc --allow calc.py --check 'python3 -m pytest -q' --follow"
status=0
bin/belay run examples/calc \
	--instruction "The test suite fails: make python3 -m pytest -q pass by fixing calc.py. Change nothing else." \
	--allow calc.py \
	--check "python3 -m pytest -q" \
	--max-steps 12 --wall-time 120 \
	--follow || status=$?

say "belay runs"
bin/belay runs --limit 5
if [[ $status -eq 0 ]]; then
	say "done: the run completed, its check passed, and the patch above fixes calc.py"
else
	say "the run did not complete (exit $status)"
fi
exit "$status"
