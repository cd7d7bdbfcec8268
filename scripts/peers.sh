#!/usr/bin/env bash
# peers.sh start|stop|env — the protocol peers that belay's tests talk to.
#
# Today that is one process: Amazon's DynamoDB Local, whose jar ships inside
# the npm package amplify-dynamodb-simulator (pinned in package.json). S3 needs
# no process: the Go tests start gofakes3 in-process.
#
#   start  start DynamoDB Local on a free port (npm ci first if the jar is
#          missing), wait until it answers, print the export line. If it is
#          already running, only print the export line.
#   stop   stop it and remove its state. Harmless when nothing runs.
#   env    print the export line of the running peer; exit 1 if none runs.
#
# Use: eval "$(scripts/peers.sh start)"   or   make peers-start; eval "$(scripts/peers.sh env)"
#
# State (pid, port, log) lives in $BELAY_PEERS_DIR, default .peers/ at the
# repository root. scripts/test.sh points it at a private directory so that
# parallel test runs in one checkout each get their own DynamoDB Local.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
state=${BELAY_PEERS_DIR:-$root/.peers}
emulator=$root/node_modules/amplify-dynamodb-simulator/emulator
# Seconds to wait for DynamoDB Local to answer; it usually takes 1-3 s.
start_timeout=${BELAY_PEERS_START_TIMEOUT:-60}

say() { echo "peers: $*" >&2; }

# running succeeds if the recorded pid is alive and is our DynamoDB Local
# (a pid can be reused after a crash, so the command line is checked too).
running() {
	local pid
	[[ -f $state/dynamodb.pid && -f $state/dynamodb.port ]] || return 1
	pid=$(<"$state/dynamodb.pid")
	[[ -r /proc/$pid/cmdline ]] || return 1
	tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q 'DynamoDBLocal.jar'
}

export_line() {
	echo "export BELAY_TEST_DYNAMODB_ENDPOINT=http://127.0.0.1:$(<"$state/dynamodb.port")"
}

# answers succeeds once anything answers HTTP on the port: DynamoDB Local
# replies to an unsigned POST with a 400, which is enough to know it is up.
answers() {
	local code
	code=$(curl -s -o /dev/null -m 2 -w '%{http_code}' -X POST "http://127.0.0.1:$1/" 2>/dev/null) || true
	[[ $code != 000 && -n $code ]]
}

# free_port asks the kernel for an unused port. DynamoDB Local binds the
# wildcard address, so the probe binds the wildcard too.
free_port() {
	python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])'
}

ensure_jar() {
	[[ -f $emulator/DynamoDBLocal.jar ]] && return 0
	say "node_modules missing; running npm ci"
	(cd "$root" && npm ci --no-audit --no-fund --loglevel=error >&2)
	[[ -f $emulator/DynamoDBLocal.jar ]] || {
		say "npm ci did not produce $emulator/DynamoDBLocal.jar"
		exit 1
	}
}

stop_pid() {
	local pid=$1 i
	kill "$pid" 2>/dev/null || return 0
	for ((i = 0; i < 50; i++)); do
		kill -0 "$pid" 2>/dev/null || return 0
		sleep 0.1
	done
	kill -KILL "$pid" 2>/dev/null || true
}

start() {
	if running; then
		export_line
		return 0
	fi
	rm -f "$state/dynamodb.pid" "$state/dynamodb.port"
	command -v java >/dev/null || { say "java not found; install Java 17+ (apt-get install default-jre-headless)"; exit 1; }
	ensure_jar

	local attempt port pid began deadline
	for attempt in 1 2 3; do
		port=$(free_port)
		began=$(date +%s%N)
		# setsid: the peer outlives the shell that started it (make peers-start)
		# and does not get the terminal's Ctrl-C meant for a test run.
		# There is no flag to bind only loopback: DynamoDB Local listens on
		# every interface; everything here connects to 127.0.0.1.
		# -sharedDb: one set of tables whatever credentials and region a client
		# signs with, so a test and a Lambda bootstrap it starts see the same data.
		# -disableTelemetry: the machine has no route out, and tests need none.
		(cd "$state" && exec setsid java \
			-Djava.library.path="$emulator/DynamoDBLocal_lib" \
			-jar "$emulator/DynamoDBLocal.jar" \
			-inMemory -sharedDb -disableTelemetry -port "$port" \
			</dev/null >"$state/dynamodb.log" 2>&1 9>&-) &
		pid=$!
		deadline=$((SECONDS + start_timeout))
		while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do
			if answers "$port"; then
				echo "$pid" >"$state/dynamodb.pid"
				echo "$port" >"$state/dynamodb.port"
				say "DynamoDB Local pid $pid on 127.0.0.1:$port, up in $((($(date +%s%N) - began) / 1000000)) ms"
				export_line
				return 0
			fi
			sleep 0.1
		done
		if kill -0 "$pid" 2>/dev/null; then
			stop_pid "$pid"
			say "DynamoDB Local did not answer on port $port within ${start_timeout}s; log:"
			cat "$state/dynamodb.log" >&2
			exit 1
		fi
		# It exited: most likely the port was taken between probe and bind.
		say "DynamoDB Local exited on attempt $attempt (port $port); log:"
		cat "$state/dynamodb.log" >&2
	done
	exit 1
}

stop() {
	if running; then
		stop_pid "$(<"$state/dynamodb.pid")"
		say "DynamoDB Local stopped"
	fi
	rm -f "$state/dynamodb.pid" "$state/dynamodb.port" "$state/dynamodb.log" "$state/dynamodb-local-metadata.json"
}

cmd=${1:-}
case $cmd in
start | stop)
	mkdir -p "$state"
	# One start or stop at a time per state directory, so two callers
	# cannot both decide that nothing runs and start two peers.
	exec 9>"$state/lock"
	flock 9
	"$cmd"
	;;
env)
	if running; then
		export_line
	else
		say "no peers running; start them with: make peers-start"
		exit 1
	fi
	;;
*)
	echo "usage: $0 start|stop|env" >&2
	exit 2
	;;
esac
