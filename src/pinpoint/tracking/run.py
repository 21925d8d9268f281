"""One MLflow run per pipeline step (a child of the pipeline's parent run, parent.py), written
through a spool.

`open_step_run` never raises because the tracking server is down: the run is created when the
server answers (immediately in the normal case), everything is journaled under
<run_dir>/.mlflow-spool/ first and sent by a sender process (process.py), so this process never
imports MLflow for a step's metrics, params or artifacts (the final model's export does).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pinpoint.errors import first_line
from pinpoint.tracking.process import SenderProcess
from pinpoint.tracking.process import take as take_sender
from pinpoint.tracking.sender import LOCAL_ID_TAG, PARENT_TAG, PIPELINE_TAG, new_local_id, now_ms
from pinpoint.tracking.spool import SPOOL_DIR, Spool, warn
from pinpoint.tracking.uri import configure_http, redact, resolve_tracking_uri

STEP_TAG = "pinpoint.step"
FLUSH_TIMEOUT_S = 120.0  # how long the end of a step waits for the sender before leaving a spool
# Seconds between two sends of the journal (every step's values, batched into log_batch calls): the
# request rate is bounded by time; how often a step metric reaches MLflow is
# tracking.step_metrics_every_s (the one cadence setting).
SEND_INTERVAL_S = 1.0
CPU_SAMPLE_S = 0.1  # how often the training's logging path reads the sender's CPU clock (~1 µs a read)
TRAINING_STEPS = ("train", "trace")  # their sender gives way to the training (process.NICENESS)
RUN_ID_WAIT_S = 60.0  # how long asking for the run id waits for the first attempt to create it


class NullStepRun:
    """Tracking disabled, or not the chief: same interface, does nothing."""

    run_id = None
    enabled = False
    logs_model = False

    def hook(self):
        from pinpoint.hooks import Hook

        return Hook()

    def log_params(self, params: Mapping[str, Any]) -> None: ...
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None,
                    timestamp_ms: int | None = None) -> None: ...
    def log_step_metrics(self, metrics: Mapping[str, float], step: int) -> None: ...
    def flush_step_metrics(self) -> None: ...
    def log_checkpoint(self, files, artifact_path: str) -> None: ...
    def flush_checkpoint(self) -> None: ...
    def set_tags(self, tags: Mapping[str, Any]) -> None: ...
    def log_artifact(self, path, artifact_path: str | None = None) -> None: ...
    def log_artifacts(self, folder, artifact_path: str | None = None) -> None: ...
    def log_dict(self, data: Any, artifact_file: str) -> None: ...
    def log_model(self, model, artifact_path: str = "model") -> None: ...
    def flush(self, timeout: float = 30.0) -> bool:
        return True


class StepRun:
    """A run whose records are journaled locally and sent by a sender process (process.py)."""

    enabled = True

    def __init__(self, spool: Spool, sender: SenderProcess, *, system_metrics: bool = False,
                 node_id: str | None = None, interval: float = 1.0, log_model: bool = True,
                 step_metrics_every_s: float = 0.0, checkpoints_every_s: float = 0.0,
                 step_metrics_budget: int = 0):
        self.spool = spool
        self._local_id = spool.meta["local_id"]
        self._sender = sender
        self._interval = interval
        self._step = 0
        self._sys = None
        self._system_metrics = system_metrics
        self._node_id = node_id
        self._closed = False
        self.logs_model = log_model  # tracking.log_model: the hook logs the final model
        self._exports: list[threading.Thread] = []
        self._stop_writer = threading.Event()
        self._writer: threading.Thread | None = None
        # What tracking costs (issue 34): the sender's CPU over the run, the logging path's time.
        self._opened: tuple[float, float | None] = (0.0, None)  # (monotonic, sender CPU s) at open
        self.log_calls = 0
        self.log_s = 0.0
        self.train_cost: dict[str, Any] | None = None  # cost() at the end of training
        # Step metrics by time (tracking.step_metrics_every_s): the latest value of each metric
        # not sent yet, with its step.
        self.step_metrics_every_s = step_metrics_every_s
        self.step_metrics_budget = step_metrics_budget  # the first sends go out as logged
        self._step_sends = 0
        self._held: dict[str, tuple[float, int, int]] = {}  # key -> (value, step, timestamp ms)
        self._epoch_offset = time.time() - time.perf_counter()  # perf_counter -> wall clock
        # (monotonic, sender CPU s) every CPU_SAMPLE_S of step-metrics calls: the steady share is
        # read over the second half of training, after the run's start-up sends (params, spec).
        # Sampled at sends only (1/s), the window of a 2 s run began 0.3 s before its end and
        # often held none of the sender's passes (one a second): a share of 0.
        self._cpu_samples: list[tuple[float, float]] = []
        self._sampled_at = float("-inf")
        # Checkpoints by time (tracking.checkpoints_every_s): the newest one not sent yet.
        self.checkpoints_every_s = checkpoints_every_s
        self._held_checkpoint: tuple[list[Path], str] | None = None
        self._checkpoint_sent_at = float("-inf")
        self._step_sent_at = float("-inf")

    # ---- lifecycle -------------------------------------------------------------------------
    def _start(self) -> None:
        # The run is created by the sender process: training waits neither for MLflow's import,
        # the store nor the server (an outage spools and creates the run later).
        self._sender.open(self.spool.folder, self._interval)
        self._opened = (time.monotonic(), self._sender.cpu_s())
        self._writer = threading.Thread(target=self._write_journal, name="pinpoint-journal", daemon=True)
        self._writer.start()
        if self._system_metrics:
            from pinpoint.tracking.sysmetrics import SystemMetricsSampler

            self._sys = SystemMetricsSampler(self, node_id=self._node_id)
            self._sys.start()

    def _write_journal(self) -> None:
        """Buffered metric records reach the journal (and so the sender) once per interval."""
        while not self._stop_writer.wait(self._interval):
            self.spool.write_buffered()

    @property
    def run_id(self) -> str:
        """The MLflow run id; `local-...` while the server has not created the run yet. Asking
        waits for the sender's first attempt to create it (only callers that need the id pay)."""
        if self._sender.run_id is None:
            self._sender.tried_create.wait(RUN_ID_WAIT_S)
        return self._sender.run_id or self._local_id

    def unsent(self) -> int:
        """Records journaled (or buffered) that the server has not confirmed yet."""
        return self.spool.count() - self._sender.acked

    def flush(self, timeout: float = 30.0) -> bool:
        """Send everything logged so far now; False after `timeout` s or as soon as a send
        attempt fails (server down: the spool keeps it)."""
        failures = self._sender.failures
        self.spool.write_buffered()
        self._sender.wake(force=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.unsent() == 0:
                return True
            if self._sender.failures > failures or not self._sender.alive:
                return False
            time.sleep(0.05)
        return False

    def close(self, status: str = "FINISHED") -> bool:
        if self._closed:
            return True
        self._closed = True
        if self._sys is not None:
            self._sys.stop()
        for export in self._exports:  # the model is part of the run: wait for its export
            export.join()
        self.flush_checkpoint()  # e.g. training stopped by an error after a held checkpoint
        self.flush_step_metrics()
        self.spool.append("end_run", status=status, end_time=now_ms())
        self._stop_writer.set()
        cost = self.cost()
        closing = time.monotonic()
        done = self._sender.close(FLUSH_TIMEOUT_S)
        self._write_cost(cost, time.monotonic() - closing)
        if done:
            self.spool.remove()
        else:
            warn(f"{self.unsent()} MLflow record(s) of run {self.run_id} could not be sent to "
                 f"{redact(self._sender.uri)}; they are kept in {self.spool.folder}; send them with "
                 f"`pinpoint upload-spool {self.spool.folder}`")
        return done

    def _write_cost(self, at_close: dict[str, Any], close_s: float) -> None:
        """tracking.json in the run folder: the MLflow run's id (None if the server never created
        it), the cost over training (`train`, taken when training ended), over the whole run
        (`run`), and the wait for the last records at close."""
        run_dir = self.spool.meta.get("run_dir")
        if not run_dir:
            return
        from pinpoint.runfolder import TRACKING_COST, atomic_write_json

        with contextlib.suppress(OSError):
            atomic_write_json(Path(run_dir) / TRACKING_COST,
                              {"run_id": self._sender.run_id, "train": self.train_cost, "run": at_close,
                               "close_s": round(close_s, 3)})

    # ---- logging (journal only: never touches the network) ----------------------------------
    def log_params(self, params: Mapping[str, Any]) -> None:
        from pinpoint.tracking.params import param_value

        if params:
            self.spool.append("params", params={str(k): param_value(v) for k, v in params.items()})

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        if tags:
            self.spool.append("tags", tags={str(k): str(v) for k, v in tags.items()})

    def cost(self) -> dict[str, Any]:
        """What tracking has cost: the sender process's CPU seconds since the run opened (its
        start-up's tail, the run's creation, what it sent) and, from the run's creation on (only
        sending), their share of one core over the wall time; and this process's calls of and
        time in `log_step_metrics` (the per-step logging path)."""
        now, cpu = time.monotonic(), self._sender.cpu_s()
        t0, cpu0 = self._opened
        used = cpu - cpu0 if cpu is not None and cpu0 is not None else None
        t1, cpu1 = self._sender.run_created_at or (now, None)
        sending = cpu - cpu1 if cpu is not None and cpu1 is not None and now - t1 > 0 else None
        # The steady rate: from the first sample in the second half of the sending window.
        half = [(t, c) for t, c in self._cpu_samples if t >= (t1 + now) / 2 and now - t > 0]
        steady = (now - half[0][0], cpu - half[0][1]) if half and cpu is not None else None
        return {"wall_s": round(now - t0, 3), "sender_cpu_s": used,
                "sending_wall_s": round(now - t1, 3),
                "sender_cpu_share": round(sending / (now - t1), 5) if sending is not None else None,
                "steady_wall_s": round(steady[0], 3) if steady else None,
                "sender_steady_share": round(steady[1] / steady[0], 5) if steady else None,
                "log_calls": self.log_calls, "log_s": round(self.log_s, 6),
                "log_us_per_call": round(1e6 * self.log_s / self.log_calls, 3) if self.log_calls else None,
                "records": self.spool.count()}

    def log_step_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """A training step's metrics: the first `step_metrics_budget` sends as logged (a short run's
        curve), then at most once per `step_metrics_every_s` (per metric: a
        metric held back is sent, at its own step, with the next send or `flush_step_metrics`):
        at 1,000 steps a second the sender still writes a few values a second, not thousands.
        The training's logging path: its calls and time are counted (`cost`)."""
        started = time.perf_counter()
        if self._step_sends < self.step_metrics_budget or started - self._step_sent_at >= self.step_metrics_every_s:
            self._step_sent_at = started
            self._step_sends += 1
            if self._held:
                self.flush_step_metrics()
            self.log_metrics(metrics, step=step)
        else:
            held, ts = self._held, int(1000 * (started + self._epoch_offset))  # when it was logged
            for key, value in metrics.items():
                held[key] = (value, step, ts)
        if started - self._sampled_at >= CPU_SAMPLE_S and self._sender.run_created_at is not None:
            self._sampled_at = started
            if (cpu := self._sender.cpu_s()) is not None:
                self._cpu_samples.append((time.monotonic(), cpu))
        self.log_calls += 1
        self.log_s += time.perf_counter() - started

    def log_checkpoint(self, files, artifact_path: str) -> None:
        """A checkpoint's files (its prefix's .index/.data-* and the state file), sent at most once
        per `checkpoints_every_s`: the newest one when the time has come; one written sooner is
        held (not copied: it is the newest, so the checkpoint manager keeps it) until a newer one
        replaces it, or until `flush_checkpoint` (the end of training, the run's close)."""
        if time.monotonic() - self._checkpoint_sent_at >= self.checkpoints_every_s:
            self._held_checkpoint = None
            self._send_checkpoint(files, artifact_path)
        else:
            self._held_checkpoint = ([Path(f) for f in files], artifact_path)

    def flush_checkpoint(self) -> None:
        """Send the checkpoint held back, if any (its files are snapshotted now)."""
        held, self._held_checkpoint = self._held_checkpoint, None
        if held is not None:
            self._send_checkpoint(*held)

    def _send_checkpoint(self, files, artifact_path: str) -> None:
        self._checkpoint_sent_at = time.monotonic()
        for f in files:
            self.log_artifact(f, artifact_path)

    def flush_step_metrics(self) -> None:
        """Send the step metrics held back (each at its own step and the time it was logged)."""
        held, self._held = self._held, {}
        by_step: dict[tuple[int, int], dict[str, float]] = {}
        for key, (value, step, ts) in held.items():
            by_step.setdefault((step, ts), {})[key] = value
        for (step, ts), metrics in sorted(by_step.items()):
            self.log_metrics(metrics, step=step, timestamp_ms=ts)

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None,
                    timestamp_ms: int | None = None) -> None:
        if step is None:
            step = self._step
            self._step += 1
        ts, step = timestamp_ms or now_ms(), int(step)
        try:  # the common case in one pass (a training step's logging path: issue 34, <= 5 µs)
            rows = [[str(key), float(value), ts, step] for key, value in metrics.items()]
        except (TypeError, ValueError):
            rows = []
            for key, value in metrics.items():
                try:
                    rows.append([str(key), float(value), ts, step])
                except (TypeError, ValueError):
                    continue  # not a number: not a metric
        if rows:
            # In memory until the sender's next pass (no disk write or request per step).
            self.spool.append("metrics", metrics=rows)

    def log_artifact(self, path, artifact_path: str | None = None) -> None:
        if Path(path).is_file():
            self._log_path(Path(path), artifact_path)
        else:
            warn(f"MLflow artifact {path} does not exist; not logged")

    def log_artifacts(self, folder, artifact_path: str | None = None) -> None:
        if Path(folder).is_dir():
            self._log_path(Path(folder), artifact_path)
        else:
            warn(f"MLflow artifact folder {folder} does not exist; not logged")

    def _log_path(self, src: Path, artifact_path: str | None) -> None:
        rid = f"{self._local_id}:a{uuid.uuid4().hex[:12]}"
        snap = self.spool.snapshot(rid, src)
        self.spool.append(
            "artifact",
            blob=str(snap.relative_to(self.spool.folder)),
            artifact_path=artifact_path,
            is_dir=src.is_dir(),
            ref=rid,
        )

    def log_dict(self, data: Any, artifact_file: str) -> None:
        """Write `data` as JSON to artifact_file (e.g. 'placement.json' or 'x/y.json')."""
        with tempfile.TemporaryDirectory() as tmp:
            p = Path(tmp) / Path(artifact_file).name
            p.write_text(json.dumps(data, indent=2, default=str))
            parent = str(Path(artifact_file).parent)
            self.log_artifact(p, None if parent == "." else parent)

    def log_model(self, model, artifact_path: str = "model") -> None:
        """Save a Keras model in MLflow's keras flavor (pyfunc-loadable) and log it, in a
        background thread; `close` waits for it. A model that cannot be saved is a warning."""

        def export():
            from pinpoint.tracking.model import save_keras_model

            try:
                with tempfile.TemporaryDirectory() as tmp:
                    path = save_keras_model(model, Path(tmp) / artifact_path)
                    self.log_artifacts(path, artifact_path)
            except Exception as err:  # noqa: BLE001 - a model that cannot be saved must not fail training
                warn(f"could not save the final model for MLflow: {type(err).__name__}: {first_line(err)}")

        thread = threading.Thread(target=export, name="pinpoint-mlflow-model", daemon=True)
        self._exports.append(thread)
        thread.start()

    def hook(self):
        from pinpoint.tracking.hook import TrackingHook

        return TrackingHook(self)


@contextlib.contextmanager
def open_step_run(cfg, step: str, run_dir, *, parent_run_id: str | None = None, is_chief: bool = True,
                  system_metrics: bool | None = None, node_id: str | None = None,
                  uri: str | None = None) -> Iterator[StepRun | NullStepRun]:
    """A child run for one pipeline step. Params of the config are logged at once; the run ends
    FINISHED, or FAILED/KILLED if the block raises. Only the chief tracks (others get a no-op)."""
    if not cfg.tracking.enabled or not is_chief:
        yield NullStepRun()
        return
    configure_http()
    uri = uri or resolve_tracking_uri(cfg)
    local_id = new_local_id()
    folder = Path(run_dir) / SPOOL_DIR / f"{step}-{local_id[len('local-'):][:12]}"
    meta = {
        # Credentials in the URI (user:password@) stay in memory, never in the run folder.
        "uri": redact(uri),
        "experiment": cfg.tracking.experiment,
        "run_name": f"{cfg.name}/{step}",
        "local_id": local_id,
        "parent_run_id": parent_run_id,
        "pipeline": cfg.name,
        "step": step,
        "run_dir": str(Path(run_dir).resolve()),
        "pid": os.getpid(),
        "host": socket.gethostname(),
    }
    spool = Spool.create(folder, meta, buffered=True)
    tags = {
        LOCAL_ID_TAG: local_id,
        STEP_TAG: step,
        PIPELINE_TAG: cfg.name,
        "pinpoint.config_digest": cfg.digest(),
    }
    spool.append("create_run", local_id=local_id, experiment=cfg.tracking.experiment,
                 run_name=meta["run_name"], tags=tags, start_time=now_ms(),
                 parent_run_id=parent_run_id, pipeline=cfg.name)
    if system_metrics is None:
        system_metrics = step == "train"
    # The steps that run a training send from a lower-priority process (process.SenderProcess).
    run = StepRun(spool, take_sender(uri, step in TRAINING_STEPS), system_metrics=system_metrics, node_id=node_id,
                  interval=SEND_INTERVAL_S, log_model=cfg.tracking.log_model,
                  step_metrics_every_s=cfg.tracking.step_metrics_every_s,
                  checkpoints_every_s=cfg.tracking.checkpoints_every_s,
                  step_metrics_budget=cfg.tracking.step_metrics_budget)
    from pinpoint.tracking.params import config_params

    run.log_params(config_params(cfg))
    run._start()
    orphans = _orphans(Path(run_dir), exclude=folder)
    if orphans:
        # What a previous process in this run folder (a restarted chief) journaled but could
        # not send: the sender process sends it, and ends that run KILLED.
        run._sender.send("adopt", folders=[str(f) for f in orphans])
    status = "FINISHED"
    try:
        yield run
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    except BaseException:
        status = "FAILED"
        raise
    finally:
        run.close(status)


def _orphaned(spool_folder: Path) -> bool:
    """A spool whose writer process is gone (killed, crashed, restarted by the launcher)."""
    try:
        meta = json.loads((spool_folder / "meta.json").read_text())
    except (OSError, ValueError):
        return False
    if meta.get("host") != socket.gethostname() or not meta.get("pid"):
        return False  # another machine's spool: leave it to `pinpoint upload-spool`
    try:
        os.kill(int(meta["pid"]), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _orphans(run_dir: Path, exclude: Path) -> list[Path]:
    from pinpoint.tracking.spool import find_spools

    return [f for f in find_spools(run_dir) if f != exclude and _orphaned(f)]


__all__ = ["PARENT_TAG", "STEP_TAG", "NullStepRun", "StepRun", "open_step_run"]
