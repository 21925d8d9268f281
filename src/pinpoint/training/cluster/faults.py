"""Real faults for local clusters, injected from the outside (the training code has no hooks).

- `kill_task(out_dir, "worker:0")`: SIGKILL a task's process, found in OUT/tasks.json.
- `NetnsLink`: a network namespace joined to the host by a veth pair; a task started inside it
  (`task_prefix` / `task_hosts` of run_local_cluster) can be cut off from every other task by
  taking the link down (packets are dropped, so peers see a silent partition, not a refused
  connection) and healed by bringing it up. Needs root and iproute2.
- `history_gaps(out_dir, ...)`: the logged steps missing from, or duplicated in, train_log.jsonl.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from pinpoint.runfolder import TRAIN_LOG, last_logged_step
from pinpoint.training.cluster.launcher import LAUNCHER_FILE, TASKS_FILE


def read_json_or_none(path: Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (FileNotFoundError, ValueError):
        return None


def wait_for(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.05):
    """Poll until `predicate()` is truthy and return its value; TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:.0f} s for {what}")
        time.sleep(interval)


def current_attempt(out_dir: Path) -> int:
    doc = read_json_or_none(Path(out_dir) / TASKS_FILE)
    return int(doc["attempt"]) if doc else 0


def wait_for_step(out_dir: Path, step: int, timeout: float, attempt: int | None = None) -> int:
    """Wait until the chief has logged `step` (during `attempt`, if given); return the step seen."""
    def reached():
        if attempt is not None and current_attempt(out_dir) != attempt:
            return None
        s = last_logged_step(Path(out_dir))
        return s if s is not None and s >= step else None

    return wait_for(reached, timeout, f"step {step} in {Path(out_dir) / TRAIN_LOG}")


def kill_task(out_dir: Path, name: str, sig: int = signal.SIGKILL) -> int:
    """Send `sig` to the process of task `name` of the current attempt; return its pid."""
    doc = read_json_or_none(Path(out_dir) / TASKS_FILE)
    if not doc or name not in doc["tasks"]:
        raise LookupError(f"no task '{name}' in {Path(out_dir) / TASKS_FILE}")
    pid = int(doc["tasks"][name]["pid"])
    os.kill(pid, sig)
    return pid


def launcher_record(out_dir: Path) -> dict:
    return read_json_or_none(Path(out_dir) / LAUNCHER_FILE) or {}


def logged_steps(out_dir: Path) -> list[int]:
    """Steps in train_log.jsonl, in file order (duplicates kept)."""
    path = Path(out_dir) / TRAIN_LOG
    steps = []
    for line in path.read_text().splitlines() if path.is_file() else ():
        try:
            steps.append(int(json.loads(line)["step"]))
        except (ValueError, KeyError, TypeError):
            continue
    return steps


def history_gaps(out_dir: Path, expected: list[int]) -> tuple[list[int], list[int]]:
    """(missing, duplicated) logged steps of the final history compared with `expected`."""
    steps = logged_steps(out_dir)
    seen: set[int] = set()
    dups = sorted({s for s in steps if s in seen or seen.add(s)})  # type: ignore[func-returns-value]
    missing = [s for s in expected if s not in seen]
    return missing, dups


# ---- network partitions ----------------------------------------------------------------------
def netns_available() -> str | None:
    """None if network namespaces can be created here, else why not (one line)."""
    if shutil.which("ip") is None:
        return "iproute2 ('ip') is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root"
    name = f"pp-probe-{os.getpid()}"
    try:
        _ip("netns", "add", name)
    except subprocess.CalledProcessError as err:
        return f"'ip netns add' failed: {err.stderr.strip()}"
    _ip("netns", "del", name, check=False)
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


class NetnsLink:
    """A namespace `pp<id>` reachable from the host through a veth pair on a private /30.

    host_ip is the host end (tasks in the host namespace advertise it), ns_ip the namespace end;
    `prefix` runs a command inside the namespace. `cut()` takes the namespace end down: packets
    to it vanish (peers wait for timeouts, as in a real partition) and the task inside loses its
    route to everyone else. Use as a context manager so the namespace is always removed.
    """

    def __init__(self, subnet_octet: int | None = None):
        tag = os.getpid() % 10000
        self.ns = f"pp{tag}"
        self.host_if, self.ns_if = f"pp{tag}h", f"pp{tag}n"
        octet = subnet_octet if subnet_octet is not None else (os.getpid() % 250) + 1
        self.host_ip, self.ns_ip = f"10.231.{octet}.1", f"10.231.{octet}.2"

    @property
    def prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.ns]

    def __enter__(self) -> NetnsLink:  # noqa: PYI034 - final class
        self.close()  # leftovers of a killed earlier run with the same pid
        try:
            _ip("netns", "add", self.ns)
            _ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
            _ip("link", "set", self.ns_if, "netns", self.ns)
            _ip("addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
            _ip("link", "set", self.host_if, "up")
            _ip("-n", self.ns, "addr", "add", f"{self.ns_ip}/30", "dev", self.ns_if)
            _ip("-n", self.ns, "link", "set", self.ns_if, "up")
            _ip("-n", self.ns, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise
        return self

    def cut(self) -> None:
        _ip("-n", self.ns, "link", "set", self.ns_if, "down")

    def heal(self) -> None:
        _ip("-n", self.ns, "link", "set", self.ns_if, "up")

    def close(self) -> None:
        _ip("netns", "del", self.ns, check=False)  # also destroys the veth pair
        _ip("link", "del", self.host_if, check=False)

    def __exit__(self, *exc) -> None:
        self.close()
