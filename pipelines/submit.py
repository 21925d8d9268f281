"""`make submit KFP_HOST=...`: compile the pipeline for a config and start a run on Kubeflow
Pipelines through kfp.Client; prints the run's URL.

Usage: python -m pipelines.submit --host https://kfp.example --config configs/demo.yaml [--sweep]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from pinpoint.cli import argparse_line
from pinpoint.errors import ConfigError, PinpointError


class SubmitError(PinpointError):
    """The Kubeflow Pipelines API could not be reached or refused the run."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(argparse_line(message, "python -m pipelines.submit"))


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m pipelines.submit", description=__doc__.splitlines()[0])
    p.add_argument("--host", required=True, help="Kubeflow Pipelines API endpoint, http(s)://...")
    p.add_argument("--config", required=True, help="pinpoint config YAML")
    p.add_argument("--experiment", help="KFP experiment (default: the config's tracking.experiment)")
    p.add_argument("--namespace", help="Kubernetes namespace (multi-user Kubeflow only)")
    p.add_argument("--run-name", help="run name (default: <config name>)")
    p.add_argument("--sweep", action="store_true", help="submit placement_sweep instead of training_pipeline")
    return p


def check_host(host: str) -> str:
    if not host.startswith(("http://", "https://")) or len(host.split("//", 1)[1].strip("/")) == 0:
        raise ConfigError(f"--host: got {host!r}; pass the KFP endpoint as http(s)://HOST[:PORT]")
    return host.rstrip("/")


def submit(host: str, config_path: str, *, experiment: str | None = None, namespace: str | None = None,
           run_name: str | None = None, sweep: bool = False) -> str:
    """Submit and return the run URL."""
    from pinpoint.config import load_config
    from pipelines.compile import SWEEP_FILE, TRAINING_FILE, compile_sweep, compile_training
    from pipelines.settings import settings_from_config

    host = check_host(host)
    cfg = load_config(config_path)
    settings = settings_from_config(cfg)
    with tempfile.TemporaryDirectory(prefix="pinpoint-submit-") as tmp:
        if sweep:
            package = compile_sweep(settings, Path(tmp) / SWEEP_FILE)
            arguments = {"runs_root": f"{settings.default_run_dir}-sweep"}
        else:
            package = compile_training(settings, Path(tmp) / TRAINING_FILE)
            arguments = {"run_dir": settings.default_run_dir}
        try:
            import warnings

            import kfp

            with warnings.catch_warnings():
                # "This client only works with Kubeflow Pipeline v2.0.0-beta.2 and later": we know.
                warnings.simplefilter("ignore", FutureWarning)
                client = kfp.Client(host=host, namespace=namespace or "kubeflow")
            result = client.create_run_from_pipeline_package(
                str(package),
                arguments=arguments,
                run_name=run_name or (f"{cfg.name}-sweep" if sweep else cfg.name),
                experiment_name=experiment or cfg.tracking.experiment,
                namespace=namespace,
            )
        except Exception as err:  # noqa: BLE001 - any client/transport failure becomes one line
            raise SubmitError(f"submit: cannot start a run on Kubeflow Pipelines at {host}: {_reason(err)}; "
                              "check KFP_HOST and that the API answers (e.g. curl $KFP_HOST/apis/v2beta1/healthz)") from None
    return f"{host}/#/runs/details/{result.run_id}"


def _reason(err: Exception) -> str:
    """A short cause: the innermost error's first line (connection refused, 404, ...)."""
    status = getattr(err, "status", None)
    if status:
        return f"HTTP {status} {getattr(err, 'reason', '')}".strip()
    inner: BaseException = err
    while getattr(inner, "reason", None) is not None and isinstance(inner.reason, BaseException):
        inner = inner.reason
    while inner.__cause__ is not None or inner.__context__ is not None:
        inner = inner.__cause__ or inner.__context__
    text = str(inner).strip().splitlines()[0] if str(inner).strip() else type(inner).__name__
    return text[:200]


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        url = submit(args.host, args.config, experiment=args.experiment, namespace=args.namespace,
                     run_name=args.run_name, sweep=args.sweep)
    except PinpointError as err:
        print(f"pinpoint: {err}", file=sys.stderr)
        return err.exit_code
    print(f"Submitted. Run: {url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
