#!/usr/bin/env bash
# image.sh [OUT] — build the sandbox image as an OCI archive, without Docker.
#
#   scripts/image.sh                      bin/belay-sandbox.oci.tar, for this machine's architecture
#   BELAY_IMAGE_ARCH=arm64 scripts/image.sh bin/belay-sandbox-arm64.oci.tar
#
# The image's one definition is sandbox-task/: the entry (sandbox-task/*.go,
# built static), the packages (sandbox-task/image/packages) and the changes
# to the root file system (sandbox-task/image/customize.sh); its user,
# entrypoint and writable folders come from hardening.Sandbox
# (sandbox-task/imagespec). This script only drives the tools:
#
#   1. go build the entry: CGO_ENABLED=0, -trimpath, no VCS stamp;
#   2. mmdebstrap --variant=essential plus the packages, docs, manuals and
#      locales left out, customize.sh run on the result, device nodes left
#      out (runc and Fargate make /dev), as one tar;
#   3. umoci: a new OCI layout with that tar as its only layer, the config
#      (user, entrypoint, working directory, labels with the version), then
#      garbage-collected;
#   4. the layout packed as one tar (an "oci-archive"), sorted, owned by 0,
#      with every time set to SOURCE_DATE_EPOCH.
#
# Reproducible: with the same inputs (commit, Debian mirror content,
# SOURCE_DATE_EPOCH, default: the commit's time) it gives the same bytes, so
# the same digest. It prints the manifest digest, the architecture and the
# sizes, and writes them beside the archive in OUT.json (bin/
# belay-sandbox.oci.json) for the bench and the CDK app to read.
#
# Needs root (mmdebstrap's root mode writes files owned by root and the
# sandbox user), mmdebstrap, umoci and Go. Another architecture than the
# machine's needs qemu-user-static and binfmt_misc (see README).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

out=${1:-bin/belay-sandbox.oci.tar}
arch=${BELAY_IMAGE_ARCH:-$(dpkg --print-architecture)}
suite=${BELAY_IMAGE_SUITE:-bookworm}
version=${VERSION:-$(git describe --always --dirty 2>/dev/null || echo dev)}
if [[ -z ${SOURCE_DATE_EPOCH:-} ]]; then
	SOURCE_DATE_EPOCH=$(git log -1 --format=%ct 2>/dev/null || echo 0)
fi
export SOURCE_DATE_EPOCH
created=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)

need() {
	command -v "$1" >/dev/null 2>&1 || {
		echo "image: $1 is missing; install it: apt-get install $2" >&2
		exit 1
	}
}
if [[ $(id -u) -ne 0 ]]; then
	echo "image: run as root (mmdebstrap builds the root file system with files owned by root and by the sandbox user)" >&2
	exit 1
fi
need mmdebstrap mmdebstrap
need umoci umoci
case $arch in
amd64 | arm64) goarch=$arch ;;
*)
	echo "image: architecture $arch is not supported (amd64 or arm64)" >&2
	exit 1
	;;
esac
# Another architecture: mmdebstrap runs the packages' maintainer scripts
# under qemu-user through binfmt_misc. Mount binfmt_misc and enable the
# interpreter when the machine has them but nobody switched them on.
if [[ $arch != "$(dpkg --print-architecture)" ]]; then
	need arch-test arch-test
	need qemu-aarch64-static "qemu-user-static binfmt-support"
	if ! arch-test "$arch" >/dev/null 2>&1; then
		if ! mountpoint -q /proc/sys/fs/binfmt_misc; then
			mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc || true
		fi
		update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 || true
	fi
	if ! arch-test "$arch" >/dev/null 2>&1; then
		echo "image: this machine cannot run $arch programs ($(arch-test "$arch" 2>&1)); building for $arch needs binfmt_misc (CONFIG_BINFMT_MISC, mounted on /proc/sys/fs/binfmt_misc) with qemu-user-static's interpreter enabled" >&2
		exit 1
	fi
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/belay-image.XXXXXX")
trap 'rm -rf "$work"' EXIT

step() { echo "image: $*" >&2; }

# 1. The entry, and the values the image takes from hardening.Sandbox.
eval "$(go run ./sandbox-task/imagespec)"
export IMAGE_UID IMAGE_GID IMAGE_ENTRYPOINT IMAGE_WORKSPACE IMAGE_TMP
step "go build the entry (linux/$goarch, static, version $version)"
CGO_ENABLED=0 GOOS=linux GOARCH=$goarch go build -trimpath -buildvcs=false \
	-ldflags "-s -w -buildid= -X main.version=$version" -o "$work/belay-sandbox" ./sandbox-task
export IMAGE_ENTRY_BIN=$work/belay-sandbox

# 2. The root file system.
packages=$(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' sandbox-task/image/packages | paste -sd, -)
step "mmdebstrap $suite ($arch, essential + $packages)"
mmdebstrap --quiet --mode=root --variant=essential --architectures="$arch" \
	--include="$packages" \
	--dpkgopt='path-exclude=/usr/share/doc/*' \
	--dpkgopt='path-include=/usr/share/doc/*/copyright' \
	--dpkgopt='path-exclude=/usr/share/man/*' \
	--dpkgopt='path-exclude=/usr/share/info/*' \
	--dpkgopt='path-exclude=/usr/share/locale/*' \
	--dpkgopt='path-include=/usr/share/locale/locale.alias' \
	--dpkgopt='path-exclude=/usr/share/lintian/*' \
	--dpkgopt='path-exclude=/usr/lib/*/gconv/*' \
	--dpkgopt='force-unsafe-io' \
	--customize-hook="$root/sandbox-task/image/customize.sh \"\$1\"" \
	--skip=output/dev \
	--format=tar "$suite" "$work/rootfs.tar"

# 3. The OCI image: one layer, the config.
step "umoci: one layer, config (user $IMAGE_UID, entrypoint $IMAGE_ENTRYPOINT)"
layout=$work/oci
umoci init --layout "$layout"
umoci new --image "$layout:latest"
umoci raw add-layer --image "$layout:latest" \
	--history.created "$created" --history.created_by "scripts/image.sh (mmdebstrap $suite)" \
	"$work/rootfs.tar"
umoci config --image "$layout:latest" \
	--created "$created" --architecture "$arch" --os linux \
	--config.user "$IMAGE_UID:$IMAGE_GID" \
	--config.entrypoint "$IMAGE_ENTRYPOINT" \
	--config.workingdir "$IMAGE_WORKSPACE" \
	--config.env "PATH=/usr/local/bin:/usr/bin:/bin" \
	--config.label "org.opencontainers.image.title=belay-sandbox" \
	--config.label "org.opencontainers.image.version=$version" \
	--config.label "org.opencontainers.image.created=$created" \
	--config.label "org.opencontainers.image.base.name=debian:$suite" \
	--history.created "$created" --history.created_by "scripts/image.sh (config)"
umoci gc --layout "$layout"

# 4. The archive, the same bytes every time.
mkdir -p "$(dirname "$out")"
tar --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner \
	--format=posix --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
	-C "$layout" -cf "$out.tmp" .
mv "$out.tmp" "$out"

manifest=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["manifests"][0]["digest"])' "$layout/index.json")
compressed=$(python3 -c '
import json, sys
layout = sys.argv[1]
m = json.load(open(layout + "/index.json"))["manifests"][0]["digest"].split(":")[1]
man = json.load(open(layout + "/blobs/sha256/" + m))
print(sum(l["size"] for l in man["layers"]) + man["config"]["size"])' "$layout")
unpacked=$(stat -c %s "$work/rootfs.tar")
cat >"${out%.tar}.json" <<JSON
{"digest": "$manifest", "architecture": "$arch", "os": "linux", "version": "$version", "created": "$created", "compressedBytes": $compressed, "unpackedBytes": $unpacked}
JSON
step "wrote $out: $manifest ($arch), $((compressed / 1000000)) MB compressed, $((unpacked / 1000000)) MB unpacked"
echo "$manifest"
