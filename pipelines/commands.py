"""`pinpoint run` and `pinpoint compile`: the kfp-facing commands of the `pinpoint` CLI.

The library's CLI (src/pinpoint/cli.py) does not know about this package: pyproject.toml
registers these functions in the `pinpoint.commands` entry-point group, and the CLI calls each
one with its subparsers (the protocol: add one subparser whose defaults set `fn(args) -> int`).
Nothing here imports kfp; the commands do, when they run.
"""

from __future__ import annotations

from pathlib import Path


def add_run(sub) -> None:
    s = sub.add_parser("run", help="the local pipeline (kfp.local): provision -> train -> report")
    s.add_argument("config")
    s.add_argument("--runs-root", default="runs")
    s.set_defaults(fn=cmd_run)


def add_compile(sub) -> None:
    s = sub.add_parser("compile", help="compile the kfp pipelines to YAML")
    s.add_argument("--out", required=True, help="output file or folder")
    s.add_argument("--config", help="compile in this config's cluster settings (image, GPUs, tolerations)")
    s.set_defaults(fn=cmd_compile)


def cmd_run(args) -> int:
    from pinpoint.config import load_config
    from pinpoint.usercode import preflight

    # Fail fast, before kfp starts anything or the provision step writes the run folder.
    preflight(load_config(args.config))
    from pipelines.local_run import run_local

    return run_local(args.config, runs_root=Path(args.runs_root))


def cmd_compile(args) -> int:
    from pipelines.compile import compile_all

    for path in compile_all(Path(args.out), args.config):
        print(f"wrote {path}")
    return 0
