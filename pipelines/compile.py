"""`make compile`: the kfp pipelines as YAML (for `make submit` or the Kubeflow UI).

Usage: python -m pipelines.compile --out pipelines/training_pipeline.yaml [--config configs/demo.yaml]
writes training_pipeline.yaml and placement_sweep.yaml (next to each other). GPU, node selector,
tolerations, image and the MLflow Secret come from the config (kfp fixes them at compile time).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

TRAINING_FILE = "training_pipeline.yaml"
SWEEP_FILE = "placement_sweep.yaml"


def compile_all(out: str | Path, config_path: str | Path | None = None, *, embed_config: bool = True) -> list[Path]:
    """Compile both pipelines; `out` is a folder or the training pipeline's .yaml path.
    embed_config=False leaves the config_yaml parameter without a default (the golden files do,
    so that they change with the pipelines, not with every new config field)."""
    from pinpoint.config import load_config
    from pinpoint.runfolder import ensure_dir
    from pipelines.settings import PipelineSettings, settings_from_config

    out = Path(out)
    if out.suffix in (".yaml", ".yml"):
        folder, training_name = out.parent, out.name
    else:
        folder, training_name = out, TRAINING_FILE
    ensure_dir(folder, field="--out")
    settings = (
        settings_from_config(load_config(config_path))
        if config_path
        else PipelineSettings(kubernetes=True)  # the default cluster: its claim and Secret
    )
    if not embed_config:
        settings = dataclasses.replace(settings, default_config_yaml="")
    return [
        compile_training(settings, folder / training_name),
        compile_sweep(settings, folder / SWEEP_FILE),
    ]


def compile_training(settings, path: Path) -> Path:
    from pipelines.training_pipeline import build_training_pipeline

    return _compile(build_training_pipeline(settings), path)


def compile_sweep(settings, path: Path) -> Path:
    from pipelines.placement_sweep import build_placement_sweep

    return _compile(build_placement_sweep(settings), path)


def _compile(pipeline, path: Path) -> Path:
    """Compile to a temp file and rename: a failed compile never leaves half a YAML."""
    from kfp import compiler

    from pinpoint.runfolder import atomic_write_text

    tmp = path.with_name(f".{path.stem}.compiling.yaml")
    try:
        compiler.Compiler().compile(pipeline_func=pipeline, package_path=str(tmp))
        atomic_write_text(path, _clean_header(tmp.read_text()))
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _clean_header(text: str) -> str:
    """Replace kfp's comment header. kfp prints each input's default with repr() there: a
    multi-line default (the config YAML) spills uncommented lines into the document as stray
    top-level keys, and dict defaults print in an order that varies between processes."""
    import yaml

    start = text.index("\ncomponents:\n") + 1
    body = text[start:]
    spec = next(yaml.safe_load_all(body))
    lines = [
        "# PIPELINE DEFINITION",
        f"# Name: {spec['pipelineInfo']['name']}",
        "# Inputs (defaults: root.inputDefinitions below):",
    ]
    for name, param in sorted(spec["root"].get("inputDefinitions", {}).get("parameters", {}).items()):
        lines.append(f"#    {name}: {param['parameterType']}")
    return "\n".join(lines) + "\n" + body


def main(argv: list[str] | None = None) -> int:
    from pinpoint.errors import PinpointError

    p = argparse.ArgumentParser(prog="python -m pipelines.compile", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="output folder or training pipeline .yaml path")
    p.add_argument("--config", help="config whose cluster settings (GPUs, image, tolerations) to compile in")
    p.add_argument("--no-config-default", action="store_true", help="do not embed the config as a default")
    args = p.parse_args(argv)
    try:
        for path in compile_all(args.out, args.config, embed_config=not args.no_config_default):
            print(f"wrote {path}")
    except PinpointError as err:
        print(f"pinpoint: {err}", file=sys.stderr)
        return err.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
