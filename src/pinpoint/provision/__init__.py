"""Cluster provisioning: a topology request -> cluster_spec.json, manifests/, placement plan.

`provision(cfg, out_dir, nodes=, kubeconfig=)` writes, all atomically:
  out_dir/config.yaml          the validated config (the next steps read it)
  out_dir/cluster_spec.json    every task with its address, resources and TF_CONFIG
  out_dir/manifests/*.yaml     ConfigMap + TFJob (flavor tfjob) or Services + Indexed Jobs (plain)
  out_dir/placement_plan.json  replica -> node, or {"status": "skipped"} without an inventory
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from pinpoint.config import Config, config_to_yaml
from pinpoint.errors import ConfigError, ProvisionError
from pinpoint.runfolder import (
    CLUSTER_SPEC,
    CONFIG_FILE,
    MANIFESTS_DIR,
    atomic_write_json,
    atomic_write_text,
    ensure_dir,
)

PLACEMENT_PLAN = "placement_plan.json"

__all__ = ["provision", "PLACEMENT_PLAN"]


def _feasibility(cfg: Config, tasks, nodes, kubeconfig) -> dict:
    from pinpoint.provision.feasibility import plan_placement
    from pinpoint.provision.inventory import inventory_from_cluster, load_inventory

    if nodes and kubeconfig:
        raise ConfigError("--nodes/--kubeconfig: got both; give one source of nodes")
    if nodes:
        inventory = load_inventory(nodes, gpu_resource=cfg.cluster.gpu_resource, gpu_type_label=cfg.cluster.gpu_type_label)
        source = f"nodes file {nodes}"
    elif kubeconfig:
        inventory = inventory_from_cluster(kubeconfig)
        source = f"cluster of kubeconfig {kubeconfig}"
    else:
        return {"status": "skipped", "reason": "no --nodes or --kubeconfig given"}
    try:
        return plan_placement(cfg, tasks, inventory, source=source)
    except ProvisionError as err:
        return {"status": "infeasible", "source": source, "reason": str(err)}


def _write_manifests(out: Path, files: dict[str, list[dict]]) -> list[Path]:
    """Build manifests/ in a temp folder and swap it in, so it never mixes two runs' files."""
    from pinpoint.provision.manifests import dump

    tmp = Path(tempfile.mkdtemp(dir=out, prefix=".manifests."))
    tmp.chmod(0o755)
    try:
        for name, docs in files.items():
            atomic_write_text(tmp / name, dump(docs))
        final = out / MANIFESTS_DIR
        old = None
        if final.exists():
            old = out / f".manifests.old.{tmp.name.rsplit('.', 1)[-1]}"
            final.rename(old)
        tmp.rename(final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return [final / name for name in files]


def _track(cfg: Config, out: Path, spec: dict, plan: dict, parent_run_id: str | None) -> str | None:
    try:
        from pinpoint.tracking import open_step_run
    except ImportError:  # tracking not installed in this image: provisioning still works
        return None
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
        run.log_artifacts(out / MANIFESTS_DIR, artifact_path=MANIFESTS_DIR)
        return run.run_id


def provision(cfg: Config, out_dir, *, nodes=None, kubeconfig=None, parent_run_id=None) -> dict:
    """Write the run folder's provisioning outputs (see the module doc) and return a summary.

    Raises ProvisionError (one line) for an impossible request, or when the inventory cannot
    hold every replica; then nothing is written (the error names the replica and the reason) and
    a previous provision's outputs in the folder are left as they were.
    """
    from pinpoint.provision.manifests import build_manifests
    from pinpoint.provision.namespace import with_namespace
    from pinpoint.provision.spec import build_tasks, cluster_spec

    # The run folder's config names its namespace, so every later step and pod uses the same one.
    cfg = with_namespace(cfg)
    tasks = build_tasks(cfg)
    files = build_manifests(cfg, tasks)
    spec = cluster_spec(cfg, tasks)
    plan = _feasibility(cfg, tasks, nodes, kubeconfig)

    if plan["status"] == "infeasible":
        # Bad input writes nothing: no half-provisioned folder for a later step to pick up.
        raise ProvisionError(plan["reason"])
    out = ensure_dir(out_dir)
    atomic_write_json(out / PLACEMENT_PLAN, plan)
    atomic_write_text(out / CONFIG_FILE, config_to_yaml(cfg))
    atomic_write_json(out / CLUSTER_SPEC, spec)
    written = _write_manifests(out, files)
    run_id = _track(cfg, out, spec, plan, parent_run_id)
    return {
        "cluster_spec": str(out / CLUSTER_SPEC),
        "manifests": [str(p) for p in written],
        "placement_plan": str(out / PLACEMENT_PLAN),
        "feasibility": plan["status"],
        "tasks": [t.name for t in tasks],
        "run_id": run_id,
        "config_digest": cfg.digest(),  # of the config written to the run folder (namespace resolved)
        "warnings": image_warnings(cfg),
    }


def image_warnings(cfg: Config) -> list[str]:
    """The manifests' pods import the user's code from the image: say so when the image is a
    stock Pinpoint image, which has none."""
    from pinpoint.config import is_import_path

    t = cfg.train
    user = [f for f, v in (("train.model", t.model), ("train.data", t.data), ("train.loss", t.loss)) if is_import_path(v)]
    repo = cfg.cluster.image.rsplit(":", 1)[0].rsplit("/", 1)[-1]
    if user and repo in ("pinpoint-cpu", "pinpoint-gpu"):
        return [f"cluster.image: got {cfg.cluster.image!r}, which does not contain your code ({', '.join(user)}); "
                f"for the Kubernetes manifests build one with `make images CODE_DIR={t.code_dir}` and set "
                "cluster.image: pinpoint-user:latest (local runs are not affected)"]
    return []
