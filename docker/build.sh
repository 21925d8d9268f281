#!/usr/bin/env bash
# `make images`: build the component images with docker or podman.
#   ENGINE=docker|podman (default: docker if present, else podman)
#   IMAGES="cpu gpu"     (default: cpu, plus gpu when the engine can reach a registry: GPU=1)
#   LOCAL_BASE=1         build the CPU image on a local debootstrap base (docker/base-image.sh);
#                        the default with podman on a machine without a registry.
#   TAG=0.1.0
set -euo pipefail
cd "$(dirname "$0")/.."
TAG=${TAG:-0.1.0}
if [ -z "${ENGINE:-}" ]; then
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then ENGINE=docker
  elif command -v podman >/dev/null; then ENGINE=podman
  else echo "images: neither docker nor podman is installed; run docker/podman-setup.sh (as root) or install docker" >&2; exit 2
  fi
fi
IMAGES=${IMAGES:-cpu${GPU:+ gpu}}
LOCAL_BASE=${LOCAL_BASE:-$([ "$ENGINE" = podman ] && echo 1 || echo 0)}

args=()
if [ "$ENGINE" = podman ] && [ "$(id -u)" = 0 ]; then
  # containers.conf for this kind of machine (runc, cgroupfs, file events); idempotent.
  bash docker/podman-setup.sh --no-service
fi
if [ "$ENGINE" = podman ]; then
  # Host networking (no CNI in sandboxes); the host's CA bundle and pip config so pip trusts
  # the same index as the host. Nothing of these ends up in a layer (build-time mounts).
  # --format docker: OCI images have no SHELL instruction (needed for pipefail in RUN).
  args+=(--format docker --network host --volume /etc/ssl/certs:/etc/ssl/certs:ro --layers)
  [ -f /etc/pip.conf ] && args+=(--volume /etc/pip.conf:/etc/pip.conf:ro)
fi

for image in $IMAGES; do
  build_args=()
  if [ "$image" = cpu ] && [ "$LOCAL_BASE" = 1 ]; then
    ENGINE=$ENGINE bash docker/base-image.sh localhost/pinpoint-base:bookworm
    build_args+=(--build-arg BASE_IMAGE=localhost/pinpoint-base:bookworm)
  fi
  echo "images: building pinpoint-$image:$TAG with $ENGINE" >&2
  start=$(date +%s)
  "$ENGINE" build "${args[@]}" "${build_args[@]}" -f "docker/Dockerfile.$image" \
    -t "pinpoint-$image:$TAG" -t "pinpoint-$image:latest" .
  echo "images: pinpoint-$image:$TAG built in $(( $(date +%s) - start ))s" >&2
done
if [ "$ENGINE" = podman ]; then
  # Every source change leaves the previous image untagged; drop those (the layer cache stays).
  podman image prune -f >/dev/null
fi
