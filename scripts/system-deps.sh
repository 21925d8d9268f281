#!/usr/bin/env bash
# Debian packages the test tiers need: chromium (MLflow UI browser check), podman/runc/debootstrap
# (image build and kfp DockerRunner tests), iproute2/iptables (network fault injection).
# Idempotent: installs only what is missing. Needs root (CI and the dev machines run as root).
set -euo pipefail
want=()
command -v chromium >/dev/null || want+=(chromium)
command -v podman >/dev/null || want+=(podman)
command -v runc >/dev/null || want+=(runc)
command -v debootstrap >/dev/null || want+=(debootstrap)
command -v ip >/dev/null || want+=(iproute2)
command -v iptables >/dev/null || want+=(iptables)
if [ ${#want[@]} -eq 0 ]; then exit 0; fi
if [ "$(id -u)" != 0 ]; then
  echo "system-deps: missing ${want[*]}; run as root or: sudo apt-get install -y ${want[*]}" >&2
  exit 1
fi
echo "system-deps: installing ${want[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${want[@]}" >/dev/null
