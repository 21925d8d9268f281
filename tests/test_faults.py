"""Fault suite: real local TF clusters, real faults injected from outside (`make test-faults`).

Each test starts a tiny cluster (an MLP on digits, chief + 1 worker [+ 1 ps]), waits for the
chief to log a step past a checkpoint, injects one fault (SIGKILL of a worker, SIGKILL of a ps,
a worker cut off by taking its network namespace's link down) and asserts that training either
recovers from the last checkpoint through a whole-group restart with no logged step lost, or fails
within a bounded time with a clear one-line message. Nothing may hang: every test has a
pytest timeout and the launcher has its own watchdog. Results go to the file given by
`--reliability-out` (`make test` passes runs/reliability.json, which `make bench` turns into the
RESULTS.md table), else to a temp folder.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pinpoint.config import config_to_yaml
from pinpoint.errors import RETRY_EXIT_CODE
from pinpoint.runfolder import METRICS, atomic_write_json, latest_checkpoint_step
from pinpoint.training.cluster.faults import (
    NetnsLink,
    current_attempt,
    history_gaps,
    kill_task,
    launcher_record,
    netns_available,
    wait_for,
    wait_for_step,
)
from pinpoint.training.cluster.launcher import run_local_cluster
from tests.conftest import NO_TRACKING, make_config

ROOT = Path(__file__).resolve().parents[1]
STEPS, CKPT_EVERY, LOG_EVERY = 240, 40, 10
FAULT_AT = 100  # inject once the chief has logged this step: checkpoint 80 exists, 20+ steps to redo
# Generous for a loaded 2-core machine (a TF process takes 10-40 s to start), still bounded.
# No collective timeout (the default): a dead or cut-off peer is detected by the tasks themselves.
LIMITS = {"startup_timeout": 300.0, "stall_timeout": 60.0, "grace": 5.0}


def _cfg(strategy="multi_worker_mirrored", *, max_restarts=2, **cluster):
    return make_config(
        "faults",
        cluster={"chief": 1, "workers": 1, "device_type": "CPU", "devices_per_worker": 1, **cluster},
        train={
            "strategy": strategy, "model": "mlp", "data": "digits", "batch_size": 32,
            "steps": STEPS, "checkpoint_every": CKPT_EVERY, "log_every": LOG_EVERY,
            "max_restarts": max_restarts, "keep_checkpoints": 10,
        },
        placement={"enabled": False}, tracking=NO_TRACKING,
    )


class Injector(threading.Thread):
    """Waits for step FAULT_AT of attempt 1, injects `fault(out)`, then optionally `after(out)`
    once the launcher has started attempt 2 (e.g. healing a network cut)."""

    def __init__(self, out: Path, fault, after=None, at_step: int = FAULT_AT):
        super().__init__(daemon=True)
        self.out, self.fault, self.after, self.at_step = out, fault, after, at_step
        self.injected_at: float | None = None
        self.step: int | None = None
        self.error: BaseException | None = None

    def run(self):
        try:
            self.step = wait_for_step(self.out, self.at_step, timeout=400, attempt=1)
            self.fault(self.out)
            self.injected_at = time.time()
            if self.after is not None:
                wait_for(lambda: current_attempt(self.out) >= 2, 300, "the group restart")
                self.after(self.out)
        except BaseException as err:  # noqa: BLE001 - handed to the test, which fails on it
            self.error = err


def rec_task(out: Path) -> str:
    """The task the launcher charged the first failure to."""
    return launcher_record(out)["failures"][0]["task"]


def _expected_steps():
    return list(range(LOG_EVERY, STEPS + 1, LOG_EVERY))


def _record(path: Path, fault: str, strategy: str, out: Path, inj: Injector, recovered: bool, total: float,
            **extra):
    """Add one row to the reliability file `path` (keyed by fault)."""
    rec = launcher_record(out)
    failures = rec.get("failures", [])
    attempts = rec.get("attempts", [])
    redone = None
    if recovered and failures and len(attempts) > 1:
        resume = attempts[1].get("resume_step") or 0
        redone = (failures[0].get("last_logged_step") or 0) - resume
    missing, dups = history_gaps(out, _expected_steps()) if recovered else ([], [])
    row = {
        "fault": fault,
        "strategy": strategy,
        "injected": 1,
        "injected_at_step": inj.step,
        "recovered": recovered,
        "restarts": max(len(attempts) - 1, 0),
        "detected_after_s": round(failures[0]["time"] - inj.injected_at, 1) if failures and inj.injected_at else None,
        "resumed_from_step": attempts[1].get("resume_step") if len(attempts) > 1 else None,
        "steps_redone": redone,
        "metrics_lost": len(missing),
        "duplicate_steps": len(dups),
        "total_s": round(total, 1),
        **extra,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        rows = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        rows = []
    rows = [r for r in rows if r.get("fault") != fault] + [row]
    atomic_write_json(path, rows)
    return row


def _assert_recovered(out: Path):
    """The group restarted once and finished, resuming from a checkpoint, losing no metric
    (which task the failure is charged to is each test's own assertion)."""
    rec = launcher_record(out)
    assert rec["status"] == "succeeded", rec
    assert len(rec["attempts"]) == 2, rec
    # The second attempt resumed from a checkpoint written before the fault, not from scratch.
    resume = rec["attempts"][1]["resume_step"]
    assert resume is not None and CKPT_EVERY <= resume <= FAULT_AT + 2 * LOG_EVERY, rec
    # Metrics lost = 0: every logged step is in the final history exactly once.
    missing, dups = history_gaps(out, _expected_steps())
    assert missing == [] and dups == [], (missing, dups)
    assert latest_checkpoint_step(out) == STEPS
    metrics = json.loads((out / METRICS).read_text())
    assert metrics  # the chief of the restarted group wrote the final metrics


def _run(cfg, out, inj: Injector, **kw):
    inj.start()
    t0 = time.time()
    try:
        rc = run_local_cluster(cfg, out, **LIMITS, **kw)
    finally:
        inj.join(timeout=5)
    assert inj.error is None, f"fault injection failed: {inj.error!r}"
    assert inj.injected_at is not None
    return rc, time.time() - t0


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sigkill_of_a_worker_mid_training_restarts_the_group_from_the_checkpoint(tmp_path, reliability_file):
    out = tmp_path / "run"
    inj = Injector(out, lambda o: kill_task(o, "worker:0", signal.SIGKILL))
    rc, total = _run(_cfg(), out, inj)
    assert rc == 0
    rec = launcher_record(out)
    assert rec["failures"][0]["task"] == "worker:0" and rec["failures"][0]["returncode"] == -signal.SIGKILL
    _assert_recovered(out)
    row = _record(reliability_file, "SIGKILL worker mid-training", "multi_worker_mirrored", out, inj, True, total)
    # Redone: the steps between the checkpoint resumed from and the last one logged before the
    # kill (injected at step 100, checkpoint every 40: at least one step, at most an interval).
    assert row["metrics_lost"] == 0 and 0 < row["steps_redone"] <= CKPT_EVERY + LOG_EVERY, row


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sigkill_of_a_parameter_server_restarts_the_group_from_the_checkpoint(tmp_path, reliability_file):
    out = tmp_path / "run"
    inj = Injector(out, lambda o: kill_task(o, "ps:0", signal.SIGKILL))
    rc, total = _run(_cfg("parameter_server", ps=1), out, inj)
    assert rc == 0
    assert rec_task(out) == "ps:0"
    _assert_recovered(out)
    row = _record(reliability_file, "SIGKILL parameter server", "parameter_server", out, inj, True, total)
    assert row["metrics_lost"] == 0


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_worker_cut_off_by_a_network_partition_is_detected_and_recovers(tmp_path, reliability_file):
    why = netns_available()
    if why:
        pytest.skip(f"network namespaces unavailable: {why}")
    out = tmp_path / "run"
    with NetnsLink() as link:
        inj = Injector(out, lambda o: link.cut(), after=lambda o: link.heal())
        rc, total = _run(
            _cfg(), out, inj, host=link.host_ip,
            task_hosts={"worker:0": link.ns_ip}, task_prefix={"worker:0": link.prefix},
        )
    assert rc == 0
    rec = launcher_record(out)
    # Detected well before the watchdog would have fired: the partition ends the attempt by itself.
    assert rec["failures"][0]["time"] - inj.injected_at < LIMITS["stall_timeout"] + 30, rec
    # Both ends lose the collective; whichever task notices first exits with the retry code.
    assert rec["failures"][0]["returncode"] == RETRY_EXIT_CODE, rec
    _assert_recovered(out)
    row = _record(reliability_file, "worker cut off (netns link down)", "multi_worker_mirrored", out, inj, True, total)
    assert row["metrics_lost"] == 0


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_out_of_restarts_fails_fast_with_one_clear_line(tmp_path, reliability_file):
    # Through the real CLI: exit code 3, one "pinpoint: ..." line, no traceback, no hang.
    out = tmp_path / "run"
    cfg_path = tmp_path / "faults.yaml"
    cfg_path.write_text(config_to_yaml(_cfg(max_restarts=0)))
    inj = Injector(out, lambda o: kill_task(o, "worker:0", signal.SIGKILL))
    inj.start()
    t0 = time.time()
    proc = subprocess.run(
        [sys.executable, "-m", "pinpoint.cli", "train", str(cfg_path), "--out", str(out), "--verbose"],
        check=False, capture_output=True, text=True, timeout=400, cwd=ROOT,
    )
    total = time.time() - t0
    inj.join(timeout=5)
    assert inj.error is None, f"fault injection failed: {inj.error!r}"
    assert proc.returncode == 3, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("pinpoint: local cluster failed: worker:0 died (signal SIGKILL)"), last
    assert "train.max_restarts=0" in last
    assert "Traceback" not in proc.stderr  # task output (and its tracebacks) goes to stdout, prefixed
    # --verbose: the tasks' TensorFlow start-up lines too, so both tasks have output to prefix.
    assert "[chief:0] " in proc.stdout and "[worker:0] " in proc.stdout
    # Bounded: the group is torn down within seconds of the death (grace + polling), not minutes.
    assert time.time() - inj.injected_at < 60
    assert launcher_record(out)["status"] == "failed"
    _record(reliability_file, "SIGKILL worker, max_restarts=0", "multi_worker_mirrored", out, inj, False, total,
            outcome=f"failed cleanly {time.time() - inj.injected_at:.0f} s after the kill, exit 3")


# ---- unit: the bookkeeping the table relies on ------------------------------------------------
@pytest.mark.unit
def test_history_gaps_counts_missing_and_duplicated_steps(tmp_path):
    (tmp_path / "train_log.jsonl").write_text("".join(f'{{"step": {s}}}\n' for s in (10, 20, 20, 40)))
    assert history_gaps(tmp_path, [10, 20, 30, 40]) == ([30], [20])


@pytest.mark.unit
def test_reliability_table_has_one_row_per_fault_and_a_total():
    from benchmarks.reliability import reliability_table

    text = reliability_table([
        {"fault": "SIGKILL worker", "strategy": "multi_worker_mirrored", "injected": 1, "injected_at_step": 100,
         "recovered": True, "restarts": 1, "detected_after_s": 0.4, "resumed_from_step": 80,
         "steps_redone": 20, "metrics_lost": 0, "total_s": 90.0},
        {"fault": "SIGKILL worker, max_restarts=0", "strategy": "multi_worker_mirrored", "injected": 1,
         "recovered": False, "restarts": 0, "metrics_lost": 0, "outcome": "failed cleanly 1 s after the kill"},
    ])
    lines = text.splitlines()
    assert lines[0].startswith("| fault injected | strategy |") and len(lines[1].split("|")) == len(lines[0].split("|"))
    assert "| SIGKILL worker | multi_worker_mirrored | 100 | yes | 1 | 0.4 | 80 | 20 | 0 | 90.0 |" in lines
    assert "no (failed cleanly 1 s after the kill)" in text
    assert "2 fault(s) injected, 1 recovered" in text and "metrics lost: 0." in text


@pytest.mark.unit
def test_only_a_lost_peer_maps_to_the_retry_exit_code():
    """A collective whose peer went away exits 138 (recreated on Kubernetes); a bug in the
    step (e.g. a shape error) stays an error the operator does not retry."""
    import tensorflow as tf

    from pinpoint.training.peers import peer_lost

    assert [peer_lost(e(None, None, "x")) for e in (
        tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.CancelledError, tf.errors.DeadlineExceededError,
        tf.errors.InvalidArgumentError, tf.errors.ResourceExhaustedError)] == [True, True, True, True, False, False]
    assert peer_lost(ValueError("UNAVAILABLE")) is False
