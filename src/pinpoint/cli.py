"""The one `pinpoint` CLI, used by the Makefile and the kfp components alike.

Each step reads its inputs from and writes its outputs to a run folder (`runs/<name>/`).
Heavy imports (TensorFlow, MLflow, kfp) happen inside the commands, never at import time.
The kfp-facing commands (`run`, `compile`) are not the library's: the repository's kfp package
registers them through the `pinpoint.commands` entry-point group (pyproject.toml).
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pinpoint.errors import ConfigError, PinpointError

# Entry-point group of commands other packages add to the CLI (see add_registered_commands).
COMMANDS_GROUP = "pinpoint.commands"


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad argument as one line (and exit 2) like every other error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(argparse_line(message, self.prog))


def argparse_line(message: str, prog: str) -> str:
    """argparse's message in the one format, 'field: got X; do Y'."""
    import re

    if m := re.match(r"argument ([^:]+): (.*)", message):
        field, what = m.groups()
        return f"{field.split('/')[-1]}: got {what}; see `{prog} --help`"
    if m := re.match(r"the following arguments are required: (.*)", message):
        return f"{m.group(1)}: got nothing (required); pass it, see `{prog} --help`"
    if m := re.match(r"unrecognized arguments: (.*)", message):
        return f"arguments: got unrecognized {m.group(1)}; remove them, see `{prog} --help`"
    # The caller prints "pinpoint: " before the line: the prog is not repeated here.
    return f"arguments: got {message}; see `{prog} --help`"


def _default_out(config_path: str) -> Path:
    from pinpoint.config import load_config

    return Path("runs") / load_config(config_path).name


def cmd_provision(args) -> int:
    from pinpoint.config import load_config
    from pinpoint.steps.provision import provision_step

    cfg = load_config(args.config)
    out = Path(args.out) if args.out else _default_out(args.config)
    summary = provision_step(cfg, out, nodes=args.nodes, kubeconfig=args.kubeconfig, rbac=args.rbac,
                             runtime=args.runtime, parent_run_id=args.parent_run_id)
    for warning in summary["warnings"]:
        print(f"pinpoint: warning: {warning}", file=sys.stderr)
    manifests = f"{out}/manifests/ ({cfg.cluster.flavor})" if summary["manifests"] else "no manifests/"
    rbac = f", {summary['rbac']}" if summary["rbac"] else ""
    rbac += f", {summary['runtime']}" if summary.get("runtime") else ""
    print(
        f"pinpoint: {len(summary['tasks'])} task(s) ({', '.join(summary['tasks'])}) -> {out}/cluster_spec.json, "
        f"{manifests}{rbac}; feasibility: {summary['feasibility']}"
    )
    return 0


def cmd_train(args) -> int:
    from pinpoint.config import load_config
    from pinpoint.training.command import train_command

    cfg = load_config(args.config)
    out = Path(args.out) if args.out else _default_out(args.config)
    return train_command(
        cfg,
        out,
        task=args.task,
        resume_from_run=args.resume_from_run,
        parent_run_id=args.parent_run_id,
    )


def cmd_report(args) -> int:
    from pinpoint.steps.report import report_command

    return report_command(Path(args.dir), parent_run_id=args.parent_run_id)


def cmd_trace(args):
    """The steps of `pinpoint trace` (trace.session.trace_steps), which trace.launch's BOOT drives
    in a process of the program's own (or `main`, in-process): the program runs under as few of
    Pinpoint's frames as can be (trace.launch says why)."""
    from pinpoint.trace.program import Program
    from pinpoint.trace.session import trace_steps

    if args.module:
        program = Program(args.module, list(args.program), module=True)
    elif args.program:
        program = Program(args.program[0], list(args.program[1:]))
    else:
        raise ConfigError("SCRIPT: got nothing; pass a Python file (pinpoint trace train.py ARGS) or -m MODULE")
    if args.gpus is not None and args.gpus < 0:
        raise ConfigError(f"--gpus: got {args.gpus}; pass 0 or more GPUs to emulate")
    if args.log_every < 1:
        raise ConfigError(f"--log-every: got {args.log_every}; pass 1 or more batches")
    if not 0 <= args.metrics_every_s <= 3600:
        raise ConfigError(f"--metrics-every-s: got {args.metrics_every_s}; pass 0 (every logged step) to 3600 seconds")
    if args.gpu_memory is not None:
        from pinpoint.placement import GPU_MEMORY_ENV
        from pinpoint.sizes import parse_size

        os.environ[GPU_MEMORY_ENV] = str(parse_size(args.gpu_memory, "--gpu-memory"))
    if args.memory or args.gpu_memory is not None:  # a fits verdict is made from the measured memory
        from pinpoint.placement import ALLOCATOR_ENV

        # Read once, when TensorFlow creates its host allocator: before the program imports it.
        os.environ[ALLOCATOR_ENV] = "true"
        _dump_partitions()
    return trace_steps(program, out=args.out, gpus=args.gpus, tracking=not args.no_tracking,
                       log_every=args.log_every, experiment=args.experiment, metrics_every_s=args.metrics_every_s)


def _dump_partitions() -> None:
    """TensorFlow writes the partition graphs of what other runtimes of the process run (a
    parameter_server closure's) into a folder removed at exit; read once, at its first function."""
    import atexit
    import shutil
    import tempfile

    from pinpoint.placement import dump_env

    folder = tempfile.mkdtemp(prefix="pinpoint-graphs-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    os.environ.update(dump_env(Path(folder)))


def cmd_plan(args) -> int:
    if args.against and not args.verify:
        raise ConfigError(f"--against: got '{args.against}' without --verify; add --verify to check the plan "
                          "against that run, or drop it")
    if args.verify and args.against:
        if args.config or args.verify_out:
            flag = "--config" if args.config else "--verify-out"
            raise ConfigError(f"{flag}: got '{args.config or args.verify_out}' with --against; --against checks a "
                              "run made already, --config trains one: pass one of them")
        for flag, value in (("--devices", args.devices), ("--objective", args.objective), ("--links", args.links),
                            ("--gpu-memory", args.gpu_memory)):
            if value is not None:
                raise ConfigError(f"{flag}: got '{value}' with --against, which checks the plan file as it was "
                                  "written (its devices, objective and links); drop it")
        from pinpoint.steps.verify import verify_against

        return verify_against(Path(args.dir), Path(args.against), plan_file=Path(args.out) if args.out else None)
    gpu_memory = None
    if args.gpu_memory is not None:
        from pinpoint.sizes import parse_size

        gpu_memory = parse_size(args.gpu_memory, "--gpu-memory")
    if args.verify:
        from pinpoint.steps.verify import verify_command

        return verify_command(Path(args.dir), args.config, devices=args.devices, objective=args.objective,
                              out=Path(args.out) if args.out else None, links_file=args.links,
                              verify_out=args.verify_out, gpu_memory=gpu_memory)
    if args.config or args.verify_out:
        flag = "--config" if args.config else "--verify-out"
        raise ConfigError(f"{flag}: got '{args.config or args.verify_out}' without --verify; add --verify to "
                          "train the plan, or drop it")
    from pinpoint.plan.command import plan_command

    return plan_command(Path(args.dir), devices=args.devices, objective=args.objective,
                        out=Path(args.out) if args.out else None, links_file=args.links, gpu_memory=gpu_memory)


def cmd_upload_spool(args) -> int:
    from pinpoint.tracking.replay import upload_spool_command

    return upload_spool_command(Path(args.dir), uri=args.uri)


def add_registered_commands(sub) -> None:
    """Commands other packages add (`pinpoint run` and `pinpoint compile` come from the repo's
    kfp package): each entry point in the COMMANDS_GROUP group names a callable that takes the
    subparsers and adds one command whose defaults set `fn(args) -> int`."""
    from importlib.metadata import entry_points

    for entry in sorted(entry_points(group=COMMANDS_GROUP), key=lambda e: e.name):
        try:
            add = entry.load()
        except ImportError:  # an install without that package (e.g. an image without pipelines/)
            continue
        add(sub)


class _Version(argparse.Action):
    """`pinpoint --version`: Pinpoint's, TensorFlow's, Keras' and MLflow's versions (read when
    asked, not each time the parser is built)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, help="print Pinpoint's, TensorFlow's, Keras' and "
                         "MLflow's versions and exit", default=argparse.SUPPRESS)

    def __call__(self, parser, namespace, values, option_string=None):
        from pinpoint.versions import version_text

        print(version_text())
        parser.exit(0)


def _add_plan_parser(sub) -> None:
    """`pinpoint plan`'s arguments."""
    s = sub.add_parser("plan", help="propose a placement from a captured run and predict its step (plan.yaml)")
    s.add_argument("dir", metavar="RUN_DIR")
    s.add_argument("--devices", type=int, metavar="N", help="spread over the first N GPUs (parameter servers "
                                                            "for parameter_server) of the run (default: all)")
    s.add_argument("--objective", choices=["step_time", "balance"],
                   help="minimise the predicted step (needs placement.timing: true) or the busiest device's "
                        "compute (default: step_time on a timed run, else balance)")
    s.add_argument("--out", metavar="FILE", help="the plan file (default RUN_DIR/plan.yaml)")
    s.add_argument("--links", metavar="FILE",
                   help="YAML with a links: section overriding the link model (see docs/plan.md)")
    s.add_argument("--verify", action="store_true",
                   help="train --config with the plan's layers and compare prediction with measurement "
                        "(plan_check.json in the verification folder)")
    s.add_argument("--gpu-memory", metavar="SIZE", help="each GPU's memory, e.g. 16GiB: a placement whose predicted "
                   "peak on a GPU is above it is ruled out (needs a run with placement.memory; docs/plan.md)")
    s.add_argument("--config", metavar="CONFIG", help="with --verify: the config to train with the plan")
    s.add_argument("--verify-out", metavar="DIR", help="with --verify: the verification run folder "
                                                       "(default RUN_DIR-verify beside the run)")
    s.add_argument("--against", metavar="RUN2", help="with --verify: check the plan file (--out, default "
                   "RUN_DIR/plan.yaml) against RUN2, a run made with it (e.g. your traced program with the plan's "
                   "tf_device applied), instead of training --config")
    s.set_defaults(fn=cmd_plan)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="pinpoint", description=__doc__.splitlines()[0])
    p.add_argument("--version", action=_Version)
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    s = sub.add_parser("provision", help="topology request -> cluster_spec.json, manifests/, feasibility")
    s.add_argument("config")
    s.add_argument("--out", help="run folder (default runs/<name>)")
    s.add_argument("--nodes", help="node inventory YAML for the feasibility check")
    s.add_argument("--kubeconfig", help="read the node inventory from this cluster instead")
    s.add_argument("--rbac", metavar="SERVICE_ACCOUNT",
                   help="also write <out>/rbac.yaml: the Role + RoleBinding the pipeline's launch step needs, for "
                        "this ServiceAccount in the run's namespace (pipeline-runner; default-editor in a profile)")
    s.add_argument("--runtime", action="store_true",
                   help="also write <out>/runtime.yaml: the ClusterTrainingRuntime 'pinpoint-tensorflow' the "
                        "trainjob flavour runs on (Kubeflow Trainer v2; apply once per cluster)")
    s.add_argument("--parent-run-id", help=argparse.SUPPRESS)
    s.set_defaults(fn=cmd_provision)

    s = sub.add_parser("train", help="train with the configured strategy and pinning; writes placement.json")
    s.add_argument("config")
    s.add_argument("--out", help="run folder (default runs/<name>)")
    s.add_argument("--resume-from-run", metavar="RUN_ID", help="restore the latest checkpoint logged in this MLflow run")
    s.add_argument("--task", help=argparse.SUPPRESS)  # internal: ROLE:INDEX, set by the local launcher
    s.add_argument("--parent-run-id", help=argparse.SUPPRESS)
    s.set_defaults(fn=cmd_train)

    s = sub.add_parser("report", help="report.html and PNG charts from a trained run folder")
    s.add_argument("dir")
    s.add_argument("--parent-run-id", help=argparse.SUPPRESS)
    s.set_defaults(fn=cmd_report)

    s = sub.add_parser("trace", help="run your own TensorFlow program unchanged and report where its ops ran",
                       usage="pinpoint trace [--out DIR] [--gpus N] [--no-tracking] (SCRIPT.py | -m MODULE) [ARGS...]")
    s.add_argument("--out", help="run folder (default runs/<script name>)")
    s.add_argument("--gpus", type=int, help="GPUs the program is written for; emulated on logical CPUs when "
                                            "the machine has fewer")
    s.add_argument("--no-tracking", action="store_true", help="no MLflow run")
    s.add_argument("--memory", action="store_true", help="measure each device's memory over the training "
                                                          "function's first call (docs/memory.md)")
    s.add_argument("--gpu-memory", metavar="SIZE", help="each GPU's memory, e.g. 16GiB: a fits verdict per device "
                                                         "(implies --memory)")
    s.add_argument("--experiment", default="pinpoint", help="MLflow experiment (pinpoint)")
    s.add_argument("--log-every", type=int, default=10, help="send Keras' batch logs every N batches (10)")
    s.add_argument("--metrics-every-s", type=float, default=1.0,
                   help="after the first tracking.step_metrics_budget sends, step metrics reach MLflow at most once per S "
                        "seconds per metric, the latest kept "
                        "(1.0; 0: every logged step): tracking.step_metrics_every_s")
    s.add_argument("-m", dest="module", metavar="MODULE", help="run a module as `python -m MODULE` would")
    s.add_argument("program", nargs=argparse.REMAINDER, help="SCRIPT.py and its arguments (or the module's arguments)")
    s.set_defaults(fn=cmd_trace)

    _add_plan_parser(sub)

    s = sub.add_parser("upload-spool", help="send MLflow data spooled while the server was down")
    s.add_argument("dir", help="a run folder (or a spool folder)")
    s.add_argument("--uri", help="tracking URI (default: the one recorded in the spool)")
    s.set_defaults(fn=cmd_upload_spool)

    add_registered_commands(sub)

    # Accepted before or after the command (`pinpoint --verbose train ...`, `pinpoint train ... -v`).
    verbose_help = "show TensorFlow's, CUDA's and MLflow's start-up logs and warnings (hidden by default)"
    p.add_argument("-v", "--verbose", action="store_true", help=verbose_help)
    for command in sub.choices.values():
        command.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=verbose_help)
    return p


def main(argv: list[str] | None = None) -> int:
    code = _main(argv)
    if not isinstance(code, int):
        # pinpoint trace's steps where this process could not be replaced (trace.launch): the
        # program runs from this frame, two below the process' first (TensorFlow captures up to
        # 30 frames of the Python stack at every op).
        from pinpoint.trace.program import run
        from pinpoint.trace.session import first_program, send_outcome

        steps, code = code, _guarded(first_program, code)
        if not isinstance(code, int):
            code = _guarded(send_outcome, steps, run(*code))
    if argv is None:
        # The process's entry point (`pinpoint ...`, `python -m pinpoint.cli`), which exits next:
        # the objects alive now leave the cyclic garbage collector, so interpreter exit does not
        # walk them all to free memory the OS takes back anyway (~1.5 s with TensorFlow loaded,
        # ~0.8 s with MLflow and kfp). Reference counting still frees them; the files are closed.
        import gc

        gc.freeze()
    return code


@dataclass(frozen=True)
class _Launched:
    """`pinpoint trace`'s steps while its program runs in this process (trace.launch's BOOT)."""

    steps: Any  # trace.session.trace_steps' generator, suspended at its yield
    on_end: Any
    program: Any  # an ExitStack: the program's argv, sys.path and warning filters


_launched: _Launched | None = None


def launched_start():
    """In trace.launch's BOOT: `pinpoint trace ARGS` (sys.argv[1:]) up to the program, capture on;
    the program's code, for BOOT to exec in `__main__`. A bad argument: its one line, SystemExit."""
    global _launched
    import contextlib

    if sys.path and sys.path[0] == "":
        sys.path.pop(0)  # `-c`'s working directory: the program's own folder goes first instead
    from pinpoint.trace.program import as_main_program
    from pinpoint.trace.session import first_program

    steps = _guarded(_command, sys.argv[1:], True)
    if isinstance(steps, int):
        raise SystemExit(steps)
    first = _guarded(first_program, steps)
    if isinstance(first, int):
        raise SystemExit(first)
    program, on_end = first
    stack = contextlib.ExitStack()
    code = stack.enter_context(as_main_program(program, sys.modules["__main__"]))
    _launched = _Launched(steps, on_end, stack)
    return code


def launched_end(err: BaseException | None) -> None:
    """In trace.launch's BOOT, the program ended (`err`: how; None when it ran to its end): read
    what was captured, write the run folder and exit with the program's exit code."""
    launched = _launched
    if launched is None:  # launched_start ended before the program: its SystemExit (or a bug's traceback)
        raise err if err is not None else SystemExit(0)
    from pinpoint.trace.program import FINISHED, Outcome, outcome_of
    from pinpoint.trace.session import send_outcome

    launched.program.close()
    launched.on_end()  # the program's objects are alive (the traceback holds its frames)
    outcome = Outcome(0, FINISHED) if err is None else outcome_of(err)
    code = _guarded(send_outcome, launched.steps, outcome)
    import gc

    gc.freeze()  # the process exits next (main says why)
    raise SystemExit(code)


_TRACE_VALUED = {"--gpu-memory", "--out", "--gpus", "--log-every", "--experiment", "--metrics-every-s"}


def split_trace_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """`pinpoint [opts] trace [trace opts] (SCRIPT | -m MODULE) ARGS...`: everything after the
    script or module belongs to the program, options included (as with `python`)."""
    if "trace" not in argv:
        return argv, []
    i = argv.index("trace") + 1
    while i < len(argv):
        a = argv[i]
        if a == "-m":
            return argv[: i + 2], argv[i + 2:]
        if a in _TRACE_VALUED:
            i += 2
            continue
        if a.startswith("-") and a != "-":
            i += 1
            continue
        return argv[: i + 1], argv[i + 1:]
    return argv, []


def _guarded(run, *args) -> int:
    """run(*args)'s exit code; Pinpoint's errors in one line, an interrupt as 130."""
    try:
        return run(*args)
    except PinpointError as err:
        print(f"pinpoint: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("pinpoint: interrupted", file=sys.stderr)
        return 130


def _main(argv: list[str] | None):
    """A command's exit code, or pinpoint trace's steps for `main` to drive."""
    return _guarded(_command, argv)


def _command(argv: list[str] | None, launched: bool = False):
    """`launched`: this process is `pinpoint trace`'s own (launched_start), argv its arguments."""
    raw = list(sys.argv[1:] if argv is None else argv)
    front, program_args = split_trace_argv(raw)
    args = build_parser().parse_args(front)
    if args.command == "trace":
        args.program = [*args.program, *program_args]
        if argv is None:  # the process's entry point: the program gets a process of its own
            from pinpoint.trace.launch import relaunch

            relaunch(raw)  # returns only where it cannot (then the program runs in this process)
    from pinpoint.versions import check_supported

    check_supported()  # a TensorFlow outside the supported range: one line, before any work
    if argv is None or launched:  # the process's entry point: its environment is ours to set
        from pinpoint.quiet import quiet_start

        quiet_start(args.verbose)
    result = args.fn(args)
    return result if inspect.isgenerator(result) else int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
