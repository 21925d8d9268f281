"""The provision step: the run folder's cluster spec, manifests and placement plan
(pinpoint.provision), recorded in the provision step's MLflow run."""

from __future__ import annotations

from pathlib import Path

from pinpoint.config import Config
from pinpoint.provision import PLACEMENT_PLAN, provision
from pinpoint.provision.namespace import with_namespace
from pinpoint.runfolder import CLUSTER_SPEC, MANIFESTS_DIR, read_json
from pinpoint.tracking import open_step_run


def provision_step(cfg: Config, out_dir, *, nodes=None, kubeconfig=None, rbac=None, runtime: bool = False,
                   parent_run_id: str | None = None) -> dict:
    """provision(), then its params and files logged to MLflow; the summary gains `run_id`."""
    summary = provision(cfg, out_dir, nodes=nodes, kubeconfig=kubeconfig, rbac=rbac, runtime=runtime)
    out = Path(out_dir)
    # The config as provision wrote it (its namespace resolved): what the later steps read.
    summary["run_id"] = _track(with_namespace(cfg), out, read_json(out / CLUSTER_SPEC), read_json(out / PLACEMENT_PLAN),
                               parent_run_id)
    return summary


def _track(cfg: Config, out: Path, spec: dict, plan: dict, parent_run_id: str | None) -> str | None:
    gpus = {t["role"]: t["resources"]["gpus"] for t in spec["tasks"]}
    with open_step_run(cfg, "provision", out, parent_run_id=parent_run_id) as run:
        run.log_params(
            {
                "strategy": cfg.train.strategy,
                "flavor": cfg.cluster.flavor,
                "namespace": cfg.cluster.namespace,
                "tasks": len(spec["tasks"]),
                **{f"replicas.{r}": n for r, n in spec["roles"].items()},
                **{f"gpus_per_replica.{r}": n for r, n in gpus.items()},
                "emulated": cfg.cluster.emulate,
                "feasibility": plan["status"],
                # config_digest: logged with the config's params (a key twice in one batch makes
                # MLflow refuse the whole batch)
            }
        )
        run.log_artifact(out / CLUSTER_SPEC)
        run.log_artifact(out / PLACEMENT_PLAN)
        if (out / MANIFESTS_DIR).is_dir():
            run.log_artifacts(out / MANIFESTS_DIR, artifact_path=MANIFESTS_DIR)
    # Asked once the run has ended and its records were sent: the store's id whenever the run
    # reached it by then (a store slow to answer its first call, e.g. a new sqlite file's tables
    # still being made, would otherwise leave the summary the spool's local- id).
    return run.run_id
