#!/usr/bin/env bash
# `make images`: build the component images with docker or podman.
#   ENGINE=docker|podman (default: docker if present, else podman)
#   IMAGES="cpu gpu"     (default: cpu, plus gpu when the engine can reach a registry: GPU=1)
#   LOCAL_BASE=1         build the CPU image on a local debootstrap base (docker/base-image.sh);
#                        the default with podman on a machine without a registry.
#   TAG=0.1.0
#   CODE_DIR=path        also build your code's image (docker/Dockerfile.user, build context = that
#                        folder) on top of the CPU image; USER_IMAGE=name:tag names it (default
#                        pinpoint-user:TAG and pinpoint-user:latest).
set -euo pipefail
if [ -n "${CODE_DIR:-}" ]; then
  # Relative to where `make images` / this script was started, before the cd below.
  if [ ! -d "$CODE_DIR" ]; then
    echo "images: CODE_DIR: got $CODE_DIR; not a folder (pass the folder that holds your package and config)" >&2
    exit 2
  fi
  CODE_DIR=$(cd "$CODE_DIR" && pwd)
fi
cd "$(dirname "$0")/.."
TAG=${TAG:-0.1.0}
if [ -z "${ENGINE:-}" ]; then
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then ENGINE=docker
  elif command -v podman >/dev/null; then ENGINE=podman
  else echo "images: neither docker nor podman is installed; run docker/podman-setup.sh (as root) or install docker" >&2; exit 2
  fi
fi
IMAGES=${IMAGES:-cpu${GPU:+ gpu}}
# The user image is built FROM the CPU image: build (or reuse the cached layers of) that first.
if [ -n "${CODE_DIR:-}" ] && [[ " $IMAGES " != *" cpu "* ]]; then IMAGES="cpu $IMAGES"; fi
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
if [ -n "${CODE_DIR:-}" ]; then
  # podman names local images localhost/NAME; docker keeps the short name.
  prefix=$([ "$ENGINE" = podman ] && echo localhost/ || true)
  if [ -n "${USER_IMAGE:-}" ]; then user_tags=(-t "$USER_IMAGE"); shown=$USER_IMAGE
  else user_tags=(-t "pinpoint-user:$TAG" -t "pinpoint-user:latest"); shown=pinpoint-user:$TAG
  fi
  first=${shown%%/*}
  # A name without a registry part (localhost, host.domain or host:port) is local: podman's spelling.
  [[ "$shown" == */* && ( "$first" == localhost || "$first" == *.* || "$first" == *:* ) ]] || shown=$prefix$shown
  echo "images: building $shown from $CODE_DIR with $ENGINE" >&2
  start=$(date +%s)
  "$ENGINE" build "${args[@]}" --build-arg "BASE_IMAGE=${prefix}pinpoint-cpu:$TAG" \
    -f "$PWD/docker/Dockerfile.user" "${user_tags[@]}" "$CODE_DIR"
  echo "images: $shown built in $(( $(date +%s) - start ))s" >&2
  echo "images: put this in your config:  cluster: {image: $shown}  (push it to a registry your cluster pulls from, and use that name)" >&2
fi
if [ "$ENGINE" = podman ]; then
  # Every source change leaves the previous image untagged; drop those (the layer cache stays).
  podman image prune -f >/dev/null
fi
