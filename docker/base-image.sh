#!/usr/bin/env bash
# Build a local Debian bookworm base image with debootstrap + `podman import`, for machines
# without a registry. The mirror is read from apt's own sources at run time. Cached: does
# nothing when the image already exists (FORCE=1 rebuilds).
# Usage: docker/base-image.sh [IMAGE]   (default localhost/pinpoint-base:bookworm)
set -euo pipefail
IMAGE=${1:-localhost/pinpoint-base:bookworm}
ENGINE=${ENGINE:-podman}

if [ "${FORCE:-0}" != 1 ] && $ENGINE image exists "$IMAGE" 2>/dev/null; then
  echo "base-image: $IMAGE exists (FORCE=1 to rebuild)" >&2
  exit 0
fi

mirror() {
  # deb822 (*.sources: "URIs: ...") or one-line (*.list: "deb URL bookworm main") formats.
  local f
  for f in /etc/apt/sources.list.d/*.sources /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    awk '
      /^URIs:/ && $2 ~ /debian\/?$/ && $2 !~ /security/ { print $2; exit }
      /^deb / && $0 ~ /bookworm/ && $0 !~ /security/ { for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) { print $i; exit } }
    ' "$f"
  done | head -n1
}
MIRROR=${DEBIAN_MIRROR:-$(mirror)}
if [ -z "$MIRROR" ]; then
  echo "base-image: no Debian mirror found in /etc/apt/sources.list*; set DEBIAN_MIRROR=URL" >&2
  exit 2
fi

ROOT=$(mktemp -d /var/tmp/pinpoint-rootfs.XXXXXX)
trap 'rm -rf "$ROOT"' EXIT
echo "base-image: debootstrap bookworm from $MIRROR (a few minutes)" >&2
# python3-venv: the images install the lock file into a venv; ca-certificates: TLS to PyPI.
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
  bookworm "$ROOT" "$MIRROR" >&2
# Keep the image small and free of the build host's apt state.
rm -rf "$ROOT"/var/lib/apt/lists/* "$ROOT"/var/cache/apt/*.bin "$ROOT"/var/cache/apt/archives/*.deb
tar -C "$ROOT" -c . | $ENGINE import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["/bin/bash"]' - "$IMAGE" >&2
echo "base-image: built $IMAGE" >&2
