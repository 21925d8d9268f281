#!/usr/bin/env bash
# Idempotent podman setup for this machine (root, no Docker engine, no registry):
#   1. apt-get install podman runc debootstrap (if missing)
#   2. containers.conf: runc, cgroupfs, file events logger, ulimits that fit the sandbox
#   3. `podman system service` on a Docker-compatible socket (for the docker SDK and
#      kfp.local.DockerRunner), started once and reused.
# Prints `DOCKER_HOST=unix:///...` on its last line.
# `podman-setup.sh stop` stops the service this script started (and nothing else);
# `podman-setup.sh --no-service` only installs and configures (what `podman build` needs).
set -euo pipefail

SOCK_DIR=${PINPOINT_PODMAN_DIR:-/run/pinpoint-podman}
SOCK=$SOCK_DIR/podman.sock
CONF=/etc/containers/containers.conf

if [ "${1:-}" = stop ]; then
  if [ -f "$SOCK_DIR/service.pid" ]; then
    pid=$(cat "$SOCK_DIR/service.pid")
    # Only our own service: the pid must still be a `podman system service` on our socket.
    if tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -q "system service.*$SOCK"; then
      kill "$pid" && echo "podman-setup: stopped the service (pid $pid)" >&2
    fi
    rm -f "$SOCK_DIR/service.pid" "$SOCK"
  fi
  exit 0
fi

if [ "$(id -u)" != 0 ]; then
  echo "podman-setup: must run as root (rootless podman needs user namespaces this machine lacks)" >&2
  exit 2
fi

need=()
command -v podman >/dev/null || need+=(podman)
command -v runc >/dev/null || need+=(runc)
command -v debootstrap >/dev/null || need+=(debootstrap)
if [ ${#need[@]} -gt 0 ]; then
  echo "podman-setup: installing ${need[*]}" >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
fi

mkdir -p /etc/containers
if ! grep -q 'pinpoint-podman-setup' "$CONF" 2>/dev/null; then
  cat > "$CONF" <<'CONF'
# written by pinpoint docker/podman-setup.sh (pinpoint-podman-setup)
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
fi
# Without a registries.conf, short names are ambiguous; images here are all local.
if [ ! -f /etc/containers/registries.conf ]; then
  printf 'unqualified-search-registries = []\nshort-name-mode = "permissive"\n' > /etc/containers/registries.conf
fi
if [ ! -f /etc/containers/policy.json ]; then
  printf '{"default": [{"type": "insecureAcceptAnything"}]}\n' > /etc/containers/policy.json
fi

if [ "${1:-}" = --no-service ]; then
  exit 0
fi

mkdir -p "$SOCK_DIR"
if ! curl -s --unix-socket "$SOCK" http://d/_ping 2>/dev/null | grep -q OK; then
  rm -f "$SOCK"
  # --time 0: no idle timeout; the service lives until it is stopped (podman-stop.sh).
  nohup podman system service --time 0 "unix://$SOCK" >"$SOCK_DIR/service.log" 2>&1 &
  echo $! > "$SOCK_DIR/service.pid"
  for _ in $(seq 1 50); do
    curl -s --unix-socket "$SOCK" http://d/_ping 2>/dev/null | grep -q OK && break
    sleep 0.2
  done
  curl -s --unix-socket "$SOCK" http://d/_ping | grep -q OK || {
    echo "podman-setup: podman system service did not answer on $SOCK; see $SOCK_DIR/service.log" >&2
    exit 1
  }
fi
echo "DOCKER_HOST=unix://$SOCK"
