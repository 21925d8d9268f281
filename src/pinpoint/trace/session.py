"""A traced program's run: devices and the GPU names, the recorder, Keras' fit logs and
`pinpoint.log`, the MLflow step run; on exit placement.json, metrics.json, report.html and the
summary from what was captured, whatever way the program ended."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pinpoint.device_names import DeviceMap
from pinpoint.runfolder import PLACEMENT, ensure_dir
from pinpoint.trace.program import run as program_run


@dataclass
class Capture:
    """Everything that records a program while it runs (installed together, removed together)."""

    dm: DeviceMap
    log_every: int = 10
    send: Any = None  # (metrics, step=) -> None: run.log_metrics
    params: Any = None  # (dict) -> None: run.log_params
    default_scope: bool = True  # unrequested ops on the emulated /GPU:0, as on a GPU machine
    names: Any = None
    recorder: Any = None
    created: Any = None  # trace.created.CreationLog: every variable as the program created it
    requests: Any = None  # trace.requests.RequestLog: the layers' and weights' device requests
    fit: Any = None
    started: float = field(default_factory=time.monotonic)
    last_logged: dict = field(default_factory=dict)  # the last pinpoint.log metrics
    weight_rows: list | None = None  # the weights' requests, read by on_end while the layers live
    layer_units: tuple[str, ...] | None = None  # the program's layers by path, read with them
    fit_params: dict = field(default_factory=dict)  # the params fit calls logged so far
    fits: int = 0

    def __enter__(self) -> Capture:
        from pinpoint import userlog
        from pinpoint.tfcompat.api import current_device
        from pinpoint.tfcompat.check import require
        from pinpoint.trace.gpus import GpuNames
        from pinpoint.trace.keras_fit import FitPatch, KerasLogger
        from pinpoint.trace.recorder import Recorder

        require()  # every private name the patches below replace is where they expect it
        # Each part's undo is on the stack before the part installs: a failure part-way undoes
        # what was installed (also within a part), newest first, and leaves nothing patched.
        with contextlib.ExitStack() as stack:
            self.names = GpuNames(self.dm)
            stack.callback(self.names.uninstall)
            self.names.install()
            self._scope = self.names.default_scope() if self.default_scope else contextlib.nullcontext()
            stack.enter_context(self._scope)
            # The scope's full name (the job differs in a cluster): its requests are not the program's.
            default = current_device() if self.default_scope and self.dm.emulated else ""
            from pinpoint.distribute.emulation import GpuPlacement

            self.recorder = Recorder(default, GpuPlacement(self.dm) if self.dm.emulated else None,
                                     request_of=self.names.eager_request if self.dm.emulated else None)
            stack.callback(self.recorder.uninstall)
            self.recorder.install()
            from pinpoint.trace.created import CreationLog

            self.created = CreationLog(default)
            stack.callback(self.created.uninstall)
            self.created.install()
            self.recorder.watch(self.created.records)
            from pinpoint.trace.requests import RequestLog

            self.requests = RequestLog(default)
            stack.callback(self.requests.uninstall)
            self.requests.install()
            self.fit = FitPatch(lambda batch: KerasLogger(self.send_metrics, self.log_fit_params, log_every=self.log_every,
                                                          batch_size=batch, quiet=self.recorder.quiet))
            stack.callback(self.fit.uninstall)
            self.fit.install()
            stack.callback(userlog.set_sink, None)
            userlog.set_sink(self._log)
            self.names.arm()  # from here on a use of the devices is the program's
            self._undo = stack.pop_all()
        return self

    def on_end(self) -> None:
        """The program ended and its objects are still alive: read what needs them."""
        self.recorder.settle(self.created.records)
        self.weight_rows = self.requests.rows()
        self.layer_units = self.requests.units()

    def _log(self, step: int, metrics: dict) -> None:
        """pinpoint.log from a custom loop."""
        self.last_logged = metrics  # a dict of its own (pinpoint.log builds one per call)
        self.recorder.sample_if_due()  # an eager loop's chance of a sampling window
        if self.send is not None:
            self.send(metrics, step=step)

    def log_fit_params(self, params: dict) -> None:
        """A fit call's params. MLflow keeps one value per param: a later fit's value that differs
        (another model, strategy, batch size) is logged as `fit<N>.<name>`, N its call's number."""
        self.fits += 1
        new = {}
        for k, v in params.items():
            if k not in self.fit_params:
                self.fit_params[k] = new[k] = v
            elif self.fit_params[k] != v:
                new[k.replace("fit.", f"fit{self.fits}.", 1)] = v
        if new and self.params is not None:
            self.params(new)

    def send_metrics(self, metrics: dict, step: int) -> None:
        self.recorder.sample_if_due()
        if self.send is not None:
            self.send(metrics, step=step)

    def __exit__(self, *exc) -> None:
        self._undo.close()

    def placement(self, program: str, *, task: str = "chief:0") -> dict:
        """placement.json's content for what the program ran (`task`: the cluster task it ran as)."""
        from dataclasses import replace

        from pinpoint.trace.analysis import trace_placement

        notes = [f"emulation: {n}" for n in self.names.ignored]
        rows = self.weight_rows if self.weight_rows is not None else self.requests.rows()
        units = self.layer_units if self.layer_units is not None else self.requests.units()
        dm = replace(self.dm, missing=dict(self.names.missing)) if self.names.missing else self.dm
        return trace_placement(self.recorder, dm, program=program, notes=notes, weight_rows=rows, task=task,
                               layer_units=units, created=self.created.records)

    def metrics(self, placement: dict, exit_code: int) -> dict:
        from pinpoint.placement import Placement
        from pinpoint.trace.analysis import trace_metrics

        keras = self.fit.summary()
        out = trace_metrics(self.recorder, Placement.from_json(placement), exit_code=exit_code,
                            seconds=time.monotonic() - self.started, keras=keras)
        if "final_loss" not in out and self.last_logged:
            out.update({f"final_{k}": v for k, v in self.last_logged.items()})
        return out


def trace_config(name: str, *, tracking: bool, experiment: str = "pinpoint", metrics_every_s: float = 1.0):
    """The Config a traced program's MLflow run is logged under (tracking fields only matter)."""
    import re

    from pinpoint.config import Config

    # Cut to 32 characters, then stripped: a cut may not leave a trailing '-' (not a DNS-1123 name).
    slug = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:32].rstrip("-") or "program"
    if not slug[0].isalpha():
        slug = f"trace-{slug}"[:32].rstrip("-")
    return Config(name=slug, tracking={"enabled": tracking, "experiment": experiment,
                                       "step_metrics_every_s": metrics_every_s})


def trace_command(program, **options) -> int:
    """`pinpoint trace`: run `program` with capture on; the program's exit code (trace_steps'
    options)."""
    return drive(trace_steps(program, **options))


def drive(steps: Generator) -> int:
    """Run the program a `trace_steps` generator yields and let the generator finish; its exit
    code. The generator's frame is suspended while the program runs, so it is not on the stack
    TensorFlow captures at every op (see trace.launch). `pinpoint trace` runs them from a process
    of the program's own (trace.launch's BOOT), or in its own frame (cli.main) where it cannot."""
    first = first_program(steps)
    if isinstance(first, int):
        return first
    return send_outcome(steps, program_run(*first))


def first_program(steps: Generator):
    """(program, on_end) the steps yield, or their exit code if they ended before it."""
    try:
        return next(steps)
    except StopIteration as stop:
        return stop.value


def send_outcome(steps: Generator, outcome) -> int:
    """Send the program's outcome to the steps; their exit code."""
    try:
        steps.send(outcome)
    except StopIteration as stop:
        return stop.value
    raise RuntimeError("trace_steps yielded a second program")


def trace_steps(program, *, out: str | Path | None, gpus: int | None, tracking: bool, log_every: int = 10,
                experiment: str = "pinpoint", metrics_every_s: float = 1.0) -> Generator:
    """`pinpoint trace` in steps (`drive` runs them): set up, yield (program, on_end) with capture
    on and receive its trace.program.Outcome, then write what was captured; returns the
    program's exit code."""
    from pinpoint.quiet import import_tensorflow
    from pinpoint.trace import program as prog

    program.check()  # nothing runs and nothing is written for a script that is not there
    cfg = trace_config(program.name, tracking=tracking, experiment=experiment, metrics_every_s=metrics_every_s)
    out = Path(out) if out else Path("runs") / program.name
    if tracking:
        from pinpoint.tracking import warm_tracking

        warm_tracking(cfg, "trace")
    import_tensorflow()
    from pinpoint.tfcompat.check import require

    require()  # a moved private TensorFlow name fails here, in one line, before anything is written
    ensure_dir(out)
    from pinpoint.trace.gpus import device_map_for
    from pinpoint.tracking import open_step_run

    dm = device_map_for(gpus)
    label = ("-m " + program.target if program.module else program.target)
    outcome = None
    try:
        with open_step_run(cfg, "trace", out) as run:
            run.log_params({"trace.program": label, "trace.args": " ".join(program.args),
                            "trace.gpus": gpus or 0, "trace.emulated": dm.emulated})
            cap = Capture(dm, log_every=log_every, send=run.log_step_metrics, params=run.log_params)
            with cap:
                outcome = yield program, cap.on_end
            finish(cap, run, out, label, outcome.exit_code)
            if outcome.status == prog.KILLED:
                raise KeyboardInterrupt  # the run ends KILLED
            if outcome.status == prog.FAILED:
                raise _ProgramFailed  # the run ends FAILED
    except (KeyboardInterrupt, _ProgramFailed):
        pass
    if outcome is not None and outcome.error is not None and outcome.status == prog.FAILED:
        err = outcome.error
        print(f"pinpoint: {label}: the program raised {type(err).__name__}; what it ran until then is in "
              f"{out}/ ({PLACEMENT}, report.html)", file=sys.stderr)
    return outcome.exit_code if outcome is not None else 1


class _ProgramFailed(Exception):
    """Ends the MLflow run FAILED (the program's own error was already shown)."""


def finish(cap: Capture, run, out: Path, label: str, exit_code: int) -> dict:
    """placement.json and metrics.json (pinpoint.outcome, their one writer), MLflow, the summary;
    then report.html."""
    from pinpoint.hooks import HookList
    from pinpoint.outcome import write_outcome
    from pinpoint.placement import write_report
    from pinpoint.trace.analysis import unread_note
    from pinpoint.tracking.hook import TrackingHook

    content = cap.placement(label)  # placement.json's, before its one writer writes it
    try:
        keep_memory_profile(cap, content, out)
    except Exception as err:  # noqa: BLE001 - the program ran: a note, never a failed program (trace_placement)
        content["notes"] = [unread_note("the memory profile", err), *(content.get("notes") or ())]
    try:
        metrics = cap.metrics(content, exit_code)
    except Exception as err:  # noqa: BLE001
        content["notes"] = [unread_note("its metrics", err), *(content.get("notes") or ())]
        metrics = {"program": label, "exit_code": exit_code}
    hook = TrackingHook(run) if run.enabled else None
    if hook is not None:
        hook.run_dir = out
    write_outcome(out, content, metrics, HookList([hook]))
    try:
        html, charts, _ = write_report(out)
    except Exception as err:  # noqa: BLE001
        print(f"pinpoint: report.html: {unread_note('the run folder for its report', err)}", file=sys.stderr)
    else:
        if hook is not None:
            run.log_artifact(html)
    print(f"Run folder: {out}", flush=True)
    return content


def keep_memory_profile(cap: Capture, content: dict, out: Path) -> None:
    """The measured call's profiler trace under OUT/profile/ (memory.trace), so TensorBoard's memory
    profile opens on it, as on the profile Pinpoint's own loop keeps. `content`: placement.json's
    content as the capture built it, before its one writer writes it (the trace's folder is added)."""
    from pinpoint.runfolder import PROFILE, atomic_write_bytes

    memory = content.get("memory") or {}
    train = next((f for f in content.get("functions") or () if f.get("training")), None)
    if not memory.get("devices") or train is None:
        return
    record = next((r for r in cap.recorder.functions.values() if r.name == train.get("concrete")), None)
    captured = record.capture if record is not None else None
    # The call the section's figures are from (memory.calls.kept: the highest of several measured).
    kept = (memory.get("calls") or {}).get("kept")
    taken = next((t for n, t in captured.memory_more if n == kept), captured) if captured is not None else None
    xspace = getattr(taken, "memory_trace", None)
    if xspace is None:
        return
    host = (xspace.hostnames[0] if xspace.hostnames else "localhost").replace("/", "_")
    atomic_write_bytes(out / PROFILE / "plugins" / "profile" / "memory" / f"{host}.xplane.pb",
                       xspace.SerializeToString())
    memory["trace"] = PROFILE
