"""What machine the numbers come from (read without importing TensorFlow)."""

from __future__ import annotations

import datetime as dt
import os
import platform
import shutil
import subprocess


def _version(pkg: str) -> str:
    from pinpoint.versions import installed  # MLflow's client is mlflow-skinny

    return installed(pkg) or "not installed"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpus() -> list[str]:
    """GPU names from nvidia-smi (empty on a machine without NVIDIA GPUs)."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        out = subprocess.run([exe, "-L"], check=False, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [ln.split(":", 1)[1].split("(UUID")[0].strip() for ln in out.splitlines() if ln.startswith("GPU ")]


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], check=False, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], check=False, capture_output=True, text=True, timeout=10)
        return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def machine_info() -> dict:
    try:
        ncpu = len(os.sched_getaffinity(0))
    except AttributeError:
        ncpu = os.cpu_count() or 0
    try:
        load = os.getloadavg()
    except OSError:
        load = (0.0, 0.0, 0.0)
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": ncpu,
        "cpu": cpu_model(),
        "gpus": gpus(),
        "tensorflow": _version("tensorflow"),
        "keras": _version("keras"),
        "mlflow": _version("mlflow"),
        "python": platform.python_version(),
        "os": f"{platform.system()} {platform.release()}",
        "git": git_commit(),
        "loadavg_at_start": [round(x, 2) for x in load],
    }
