#!/bin/sh
# customize.sh ROOTFS — the sandbox image's own changes to the Debian root
# file system that mmdebstrap built, run by scripts/image.sh as
# mmdebstrap's customize hook (outside the chroot, as root). It is part of
# the image's one definition, with the package list beside it; the values
# come from hardening.Sandbox through the environment scripts/image.sh sets
# (IMAGE_UID, IMAGE_GID, IMAGE_ENTRYPOINT, IMAGE_WORKSPACE, IMAGE_TMP) and
# IMAGE_ENTRY_BIN, the static sandbox entry to install.
set -eu
root=$1
: "${IMAGE_UID:?}" "${IMAGE_GID:?}" "${IMAGE_ENTRYPOINT:?}" "${IMAGE_WORKSPACE:?}" "${IMAGE_TMP:?}" "${IMAGE_ENTRY_BIN:?}"

# The sandbox user. The essential variant has no useradd: write the
# entries. No password (locked), no login shell, home inside the
# workspace (the entry sets HOME there for every command).
echo "sandbox:x:$IMAGE_UID:$IMAGE_GID:belay sandbox:$IMAGE_WORKSPACE/home:/usr/sbin/nologin" >>"$root/etc/passwd"
echo "sandbox:x:$IMAGE_GID:" >>"$root/etc/group"
echo "sandbox:!::0:99999:7:::" >>"$root/etc/shadow"
if [ -f "$root/etc/gshadow" ]; then echo "sandbox:!::" >>"$root/etc/gshadow"; fi

# The entry: static, owned by root and read-only, so the user it runs as
# cannot replace it (nor could it anyway: the root file system is mounted
# read-only).
install -D -o 0 -g 0 -m 0555 "$IMAGE_ENTRY_BIN" "$root$IMAGE_ENTRYPOINT"

# The writable places, which the launcher (and Fargate) mount over: the
# workspace belongs to the sandbox user alone; /tmp and /var/tmp are
# sticky and world-writable as usual.
mkdir -p "$root$IMAGE_WORKSPACE" "$root$IMAGE_TMP" "$root/var/tmp"
chown "$IMAGE_UID:$IMAGE_GID" "$root$IMAGE_WORKSPACE"
chmod 0700 "$root$IMAGE_WORKSPACE"
chmod 1777 "$root$IMAGE_TMP" "$root/var/tmp"

# No setuid or setgid file: nothing in the sandbox may gain privileges
# (no_new_privs would refuse them anyway; this removes them at the source).
# Directories lose the bits too (they only mean group inheritance here).
find "$root" -xdev \( -perm -4000 -o -perm -2000 \) \( -type f -o -type d \) -exec chmod ug-s {} +

# The same bytes on every machine: resolv.conf and hostname are copied
# from the build host otherwise (the sandbox has no network; Fargate and
# runc supply their own).
: >"$root/etc/resolv.conf"
echo sandbox >"$root/etc/hostname"
# What dpkg's path excludes do not reach: the info index install-info
# writes, and documentation symbolic links whose targets were left out.
rm -f "$root/usr/share/info/dir"
find "$root/usr/share/doc" -xtype l -delete
# Caches that only the build wrote, and dpkg's backup copies.
rm -f "$root"/var/cache/debconf/*-old "$root"/var/lib/dpkg/*-old
