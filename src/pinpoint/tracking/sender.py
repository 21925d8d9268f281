"""Sends a spool's records to MLflow from a background thread; the training step never waits.

Rate: the thread makes one pass every `interval` seconds (tracking.run.SEND_INTERVAL_S), and a
pass sends all pending metrics in as few log_batch calls as MLflow allows (1000 metrics each),
so the number of requests depends on time, not on steps per second. flush/close force a pass.

Artifacts by time too: the file artifacts pending at a pass (a checkpoint is three files, and a
fast loop writes several between passes) go up in one log_artifacts call of a staged tree of
hard links, so the per-call work (the run's lookup, the store's session) is paid once a pass,
not once a file.

Exactly once: metrics go through log_batch with their original step and timestamp; after any
failed request (which may have reached the server before the connection dropped) and in a replay,
the (key, step) pairs already on the server are read with get_metric_history and skipped.
Run creation is idempotent too: the run carries the tag pinpoint.local_id and is looked up by it
before being created.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
import uuid
from typing import Any

from pinpoint.errors import ConfigError
from pinpoint.tracking.spool import Spool, link_or_copy, warn
from pinpoint.tracking.uri import (
    artifact_root_for,
    configure_http,
    prepare_store,
    redact,
)

LOCAL_ID_TAG = "pinpoint.local_id"
PIPELINE_TAG = "pinpoint.pipeline"
PARENT_TAG = "mlflow.parentRunId"
MAX_METRICS = 1000  # log_batch limits
MAX_PARAMS = 100
MAX_TAGS = 100


class Transient(Exception):
    """The server could not be reached (or answered 5xx): keep the records and retry later."""


class Refused(Transient):
    """The tracking store refused the run outright (a 4xx answer, e.g. a `file:` store, which
    MLflow 3 no longer opens): the records are kept as for an outage, but the store is not
    "unreachable" and will not come back by itself; the message is MLflow's, whole."""


# Modules MLflow imports on every HTTP request (its Databricks and notebook request headers): when
# one is not installed, each attempt is a full search of sys.path, about a third of the sender's
# CPU per artifact file uploaded to a server. `remember_absent_modules` records them as absent once.
ABSENT_PER_REQUEST = ("dbruntime", "IPython", "pyspark")


def remember_absent_modules() -> list[str]:
    """In the sender process: the modules of ABSENT_PER_REQUEST that are not installed become
    None in sys.modules, so importing one fails at once (as it would after the search); an
    installed one is left alone. Returns the names so recorded."""
    import importlib.util

    absent = [n for n in ABSENT_PER_REQUEST if n not in sys.modules and importlib.util.find_spec(n) is None]
    for name in absent:
        sys.modules[name] = None
    return absent


_CLIENTS: dict[str, Any] = {}
_CLIENTS_LOCK = threading.Lock()


def mlflow_client(uri: str):
    """The MlflowClient of `uri`: one per URI and process, shared by every caller (sender, parent
    run, checkpoint fetch), its store opened (a sqlite store's schema check and an `import mlflow`
    cost seconds: the sender process pays them while TensorFlow starts)."""
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(uri)
        if client is None:
            from mlflow.tracking import MlflowClient

            configure_http()
            prepare_store(uri)
            client = MlflowClient(tracking_uri=uri)
            if uri.startswith("sqlite:"):
                client.get_experiment_by_name("Default")  # opens the store (schema check) now
            _CLIENTS[uri] = client
        return client


def _classify(err: Exception) -> Exception:
    """Map an MLflow/requests error to Transient (retry) or leave it permanent (skip + warn)."""
    from mlflow.exceptions import MlflowException

    if isinstance(err, MlflowException):
        try:
            status = err.get_http_status_code()
        except Exception:  # noqa: BLE001
            status = 500
        if 400 <= status < 500 and status != 429:
            return err
    return Transient(brief(err))


def store_problem(err: Exception, uri: str) -> str:
    """A warning's start for a failed MLflow call: the server unreachable (with a short reason),
    or the store's refusal (a 4xx answer, e.g. a `file:` store MLflow 3 no longer opens) in
    MLflow's own words, whole, on one line."""
    if isinstance(_classify(err), Transient):
        return f"MLflow tracking server {redact(uri)} unreachable ({brief(err)})"
    return f"MLflow tracking store {redact(uri)} refused: {whole(err)}"


def whole(err: Exception) -> str:
    """The error's whole message on one line (a store's refusal is read in full, not briefly)."""
    return " ".join(str(err).split())


def brief(err: Exception) -> str:
    """One short phrase for a warning: 'connection refused', 'timed out', or the first line."""
    text = str(err)
    for needle, phrase in (("Connection refused", "connection refused"), ("timed out", "timed out"),
                           ("Max retries exceeded", "no answer"), ("RemoteDisconnected", "connection dropped"),
                           ("Connection aborted", "connection dropped")):
        if needle in text:
            return phrase
    return text.splitlines()[0][:200] if text else type(err).__name__


def get_or_create_experiment(client, name: str, uri: str) -> str:
    from mlflow.exceptions import MlflowException

    exp = client.get_experiment_by_name(name)
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            client.restore_experiment(exp.experiment_id)
        return exp.experiment_id
    try:
        # The experiment kind makes the MLflow 3 UI open its "Model training" view, not GenAI.
        return client.create_experiment(name, artifact_location=artifact_root_for(uri),
                                        tags={"mlflow.experimentKind": "custom_model_development"})
    except MlflowException:
        exp = client.get_experiment_by_name(name)  # created concurrently by another step
        if exp is None:
            raise
        return exp.experiment_id


def find_run_by_local_id(client, experiment_id: str, local_id: str) -> str | None:
    runs = client.search_runs(
        [experiment_id], filter_string=f"tags.`{LOCAL_ID_TAG}` = '{local_id}'", max_results=1
    )
    return runs[0].info.run_id if runs else None


def resolve_parent(client, experiment_id: str, parent: str | None, pipeline: str | None) -> str | None:
    """A parent id that is still local (`local-...`, created while the server was down) is looked
    up by its tag, and created here if no step managed to create it yet."""
    if not parent or not parent.startswith("local-"):
        return parent
    found = find_run_by_local_id(client, experiment_id, parent)
    if found:
        return found
    run = client.create_run(
        experiment_id,
        run_name=pipeline or "pipeline",
        tags={LOCAL_ID_TAG: parent, PIPELINE_TAG: pipeline or "pipeline"},
    )
    return run.info.run_id


def _stored_uri(stored: str) -> str:
    """The spool keeps a redacted URI; a replay in another process gets the credentials back
    from MLFLOW_TRACKING_URI when it names the same server."""
    if "***@" not in stored:
        return stored
    env = os.environ.get("MLFLOW_TRACKING_URI", "")
    if env and redact(env) == stored:
        return env
    raise ConfigError(
        f"upload-spool: the spool's server {stored} needs credentials; pass --uri with them "
        "or set MLFLOW_TRACKING_URI"
    )


class Sender:
    """Drains a spool into MLflow. `start()` runs it in a daemon thread; `drain_once()` is one pass."""

    def __init__(self, spool: Spool, uri: str | None = None, *, retry_interval: float = 2.0,
                 replay: bool = False, interval: float = 1.0, on_event=None):
        self.spool = spool
        meta = spool.meta
        self.uri = uri or _stored_uri(meta["uri"])
        self.retry_interval = max(retry_interval, interval)
        self.interval = interval
        self.tried_create = threading.Event()  # set after the first attempt to create the run
        self._on_event = on_event or (lambda kind, **fields: None)  # process.py relays these
        self.pending: list[dict[str, Any]] = spool.pending() if replay else []
        self.run_id: str | None = meta.get("run_id")
        self.uncertain = replay  # a request may have landed before we lost track: dedupe
        self.offline = False
        self.sent = 0
        self.failures = 0
        self._history: dict[str, set[int]] = {}
        self._client = None
        self._wake = threading.Event()
        self._closing = False
        self._force = False
        self._thread: threading.Thread | None = None
        self._on_run_created = None

    # ---- thread control ------------------------------------------------------------------
    def start(self, on_run_created=None) -> None:
        self._on_run_created = on_run_created
        self._thread = threading.Thread(target=self._loop, name="pinpoint-mlflow-sender", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wake(self, force: bool = False) -> None:
        """A pass now, before the interval is over (a flush); force=True also retries at once
        while offline."""
        if force:
            self._force = True
        self._wake.set()

    def close(self, timeout: float) -> bool:
        """Ask for a last pass and wait up to `timeout` s; True when nothing is left unsent."""
        self._closing = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        alive = self._thread is not None and self._thread.is_alive()
        return not alive and self.spool.unacked_count() == 0

    def _loop(self) -> None:
        try:
            self._loop_inner()
        except Exception as err:  # noqa: BLE001 - never take training down; the spool keeps it all
            warn(f"MLflow sender stopped on an unexpected error ({err!r}); records stay in {self.spool.folder}")

    def _loop_inner(self) -> None:
        while True:
            closing = self._closing
            self.pending.extend(self.spool.read_new())
            if self.pending:
                ok = self.drain_once()
                if not ok:
                    if closing:
                        return  # one last attempt at close; the spool keeps the rest
                    # Offline: retry every retry_interval, not on every new record; close()
                    # or a flush cuts the wait short.
                    deadline = time.monotonic() + self.retry_interval
                    while not (self._closing or self._force) and time.monotonic() < deadline:
                        self._wake.wait(max(0.0, deadline - time.monotonic()))
                        self._wake.clear()
                    self._force = False
                    continue
            if closing:
                self.pending.extend(self.spool.read_new())
                if not self.pending:
                    return
                continue
            # The next pass: after `interval`, whatever the step rate (flush/close cut it short).
            self._wake.wait(self.interval)
            self._wake.clear()

    # ---- sending -------------------------------------------------------------------------
    @property
    def client(self):
        if self._client is None:
            self._client = mlflow_client(self.uri)
        return self._client

    def drain_once(self) -> bool:
        """Send pending records in order; False (and records kept) if the server is unreachable."""
        try:
            while self.pending:
                chunk = self._next_chunk()
                self._send(chunk)
                self.spool.ack(chunk)
                self._on_event("acked", n=len(chunk))
                sent = {id(r) for r in chunk}
                self.pending = [r for r in self.pending if id(r) not in sent]
                self.sent += len(chunk)
        except Transient as err:
            self.uncertain = True
            self.failures += 1
            self._on_event("failure")
            if not self.offline:
                self.offline = True
                if isinstance(err, Refused):
                    warn(f"MLflow tracking store {redact(self.uri)} refused the run: {err} Spooling to "
                         f"{self.spool.folder}.")
                else:
                    warn(f"MLflow tracking server {redact(self.uri)} unreachable ({err}); spooling to "
                         f"{self.spool.folder} and resending when it is back")
            return False
        if self.offline:
            self.offline = False
            warn(f"MLflow tracking server {redact(self.uri)} is back; spooled records sent")
        self.uncertain = False
        self._history.clear()
        return True

    def _next_chunk(self) -> list[dict[str, Any]]:
        """The next request's records: one record, or consecutive params/tags records, or the
        pending metrics records up to the log_batch limit. Metrics are gathered across the
        artifact/params/tags records between them (their steps and timestamps travel with them,
        so the order of arrival does not matter), never across the run's start or end."""
        first = self.pending[0]
        if first["op"] == "artifact" and not first.get("is_dir"):
            return self._file_artifacts()
        if first["op"] not in ("metrics", "params", "tags"):
            return [first]
        limit = {"metrics": MAX_METRICS, "params": MAX_PARAMS, "tags": MAX_TAGS}[first["op"]]
        field = {"metrics": "metrics", "params": "params", "tags": "tags"}[first["op"]]
        chunk, size = [], 0
        for r in self.pending:
            if r["op"] != first["op"]:
                if first["op"] == "metrics" and r["op"] not in ("create_run", "end_run"):
                    continue
                break
            n = len(r[field])
            if chunk and size + n > limit:
                break
            chunk.append(r)
            size += n
        return chunk

    def _file_artifacts(self) -> list[dict[str, Any]]:
        """The pending file-artifact records up to the run's end, for one upload: a later one
        lands where an earlier one would have (same name and folder), as it would in order."""
        chunk = []
        for r in self.pending:
            if r["op"] in ("create_run", "end_run"):
                break
            if r["op"] == "artifact" and not r.get("is_dir"):
                chunk.append(r)
        return chunk

    def _send(self, chunk: list[dict[str, Any]]) -> None:
        op = chunk[0]["op"]
        try:
            if op == "create_run":
                self._create_run(chunk[0])
                return
            if self.run_id is None:
                raise RuntimeError("spool has records before its create_run record")
            getattr(self, f"_send_{op}")(chunk)
        except Transient:
            raise
        except Exception as err:
            err = _classify(err)
            if isinstance(err, Transient):
                raise err from None
            warn(f"MLflow refused {op} record(s) for run {self.run_id}: {str(err).splitlines()[0][:300]}; skipped")

    def _create_run(self, rec: dict[str, Any]) -> None:
        try:
            if self.run_id:
                return
            self._create_run_once(rec)
        finally:
            if not self.tried_create.is_set():
                self.tried_create.set()
                self._on_event("tried")

    def _create_run_once(self, rec: dict[str, Any]) -> None:
        try:
            c = self.client
            exp_id = get_or_create_experiment(c, rec["experiment"], self.uri)
            run_id = find_run_by_local_id(c, exp_id, rec["local_id"])
            if run_id is None:
                tags = dict(rec["tags"])
                parent = resolve_parent(c, exp_id, rec.get("parent_run_id"), rec.get("pipeline"))
                if parent:
                    tags[PARENT_TAG] = parent
                run = c.create_run(exp_id, start_time=rec["start_time"], tags=tags,
                                   run_name=rec["run_name"])
                run_id = run.info.run_id
        except Exception as err:  # noqa: BLE001 - run creation must succeed eventually: retry
            if isinstance(_classify(err), Transient):
                raise Transient(brief(err)) from None
            raise Refused(whole(err)) from None
        self.run_id = run_id
        self.spool.update_meta(run_id=run_id, experiment_id=exp_id)
        if self._on_run_created:
            self._on_run_created(run_id)

    def _send_metrics(self, chunk):
        from mlflow.entities import Metric

        metrics = []
        for r in chunk:
            for key, value, ts, step in r["metrics"]:
                if self.uncertain and step in self._steps_on_server(key):
                    continue
                metrics.append(Metric(key, float(value), int(ts), int(step)))
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics, synchronous=True)
            for m in metrics:
                if m.key in self._history:
                    self._history[m.key].add(m.step)

    def _steps_on_server(self, key: str) -> set[int]:
        if key not in self._history:
            try:
                hist = self.client.get_metric_history(self.run_id, key)
            except Exception as err:  # noqa: BLE001
                raise _classify_transient(err) from None
            self._history[key] = {m.step for m in hist}
        return self._history[key]

    def _send_params(self, chunk):
        from mlflow.entities import Param

        params = [Param(k, v) for r in chunk for k, v in r["params"].items()]
        self.client.log_batch(self.run_id, params=params, synchronous=True)

    def _send_tags(self, chunk):
        from mlflow.entities import RunTag

        tags = [RunTag(k, v) for r in chunk for k, v in r["tags"].items()]
        self.client.log_batch(self.run_id, tags=tags, synchronous=True)

    def _send_artifact(self, chunk):
        present = []
        for rec in chunk:
            path = self.spool.folder / rec["blob"]
            if path.exists():
                present.append((rec, path))
            else:
                warn(f"spooled artifact {path} is missing; skipped")
        if len(present) == 1:
            rec, path = present[0]
            log = self.client.log_artifacts if path.is_dir() else self.client.log_artifact
            log(self.run_id, str(path), rec.get("artifact_path"))
        elif present:
            self._send_staged(present)

    def _send_staged(self, present) -> None:
        """Several files in one call: links laid out as the artifacts will be, uploaded as a tree."""
        stage = self.spool.stage_dir()
        try:
            for rec, path in present:
                dest = stage / (rec.get("artifact_path") or "") / path.name
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.unlink(missing_ok=True)  # the later record of the same artifact wins
                link_or_copy(path, dest)
            self.client.log_artifacts(self.run_id, str(stage))
        finally:
            shutil.rmtree(stage, ignore_errors=True)

    def _send_end_run(self, chunk):
        rec = chunk[0]
        self.client.set_terminated(self.run_id, rec["status"], end_time=rec["end_time"])


def _classify_transient(err: Exception) -> Exception:
    e = _classify(err)
    return e if isinstance(e, Transient) else Transient(brief(err))


def now_ms() -> int:
    return int(time.time() * 1000)


def new_local_id() -> str:
    """A fresh `local-<hex>` id for a run not created on the server yet; the run carries it as
    its LOCAL_ID_TAG so that whoever reaches the server first can find it (find_run_by_local_id)."""
    return f"local-{uuid.uuid4().hex}"


__all__ = ["Sender", "Transient", "mlflow_client", "new_local_id", "now_ms"]
