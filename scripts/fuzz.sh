#!/usr/bin/env bash
# fuzz.sh — run every fuzz target in the module for a bounded time each.
#
# Targets are found, not listed by hand: `go test -list` names each package's
# Fuzz functions, and each one runs alone in its package, since `go test
# -fuzz` takes one target at a time. FUZZTIME (default 4s) bounds each run.
# A crash leaves its input under the package's testdata/fuzz/, where plain
# `go test` replays it from then on: commit it with the fix.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
fuzztime=${FUZZTIME:-4s}
status=0

# Each package prints its matching names, then its own "ok <pkg>" line.
listing=$(go test -list '^Fuzz' ./... 2>&1) || {
	grep -E '^FAIL[[:space:]]' <<<"$listing" >&2 || true
	echo "fuzz: the packages above do not build (go build ./... shows why); fuzzing the rest" >&2
	status=1
}
targets=$(awk '
	/^Fuzz[A-Za-z0-9_]*$/ { names[++n] = $1; next }
	/^ok / { for (i = 1; i <= n; i++) print $2, names[i]; n = 0; next }
	{ n = 0 }
' <<<"$listing")

if [[ -z $targets ]]; then
	echo "fuzz: no fuzz targets found"
	exit "$status"
fi

while read -r pkg name; do
	echo "fuzz: $pkg $name for $fuzztime"
	if ! go test -run '^$' -fuzz "^${name}\$" -fuzztime "$fuzztime" "$pkg"; then
		echo "fuzz: FAIL $pkg $name" >&2
		status=1
	fi
done <<<"$targets"
exit "$status"
