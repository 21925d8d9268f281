"""Cluster provisioning: a topology request -> cluster_spec.json, manifests/, placement plan.

`provision(cfg, out_dir, nodes=, kubeconfig=, rbac=)` writes, all atomically:
  out_dir/config.yaml          the validated config (the next steps read it)
  out_dir/cluster_spec.json    every task with its address, resources and TF_CONFIG; pod_run_dir
  out_dir/manifests/*.yaml     ConfigMap + TFJob (flavor tfjob), Services + Indexed Jobs (plain),
                               a JobSet (jobset) or a TrainJob (trainjob)
  out_dir/placement_plan.json  replica -> node, or {"status": "skipped"} without an inventory
  out_dir/rbac.yaml            with rbac=SERVICE_ACCOUNT: the launch step's Role + RoleBinding
                               (never in manifests/: the launch step cannot grant itself rights)
  out_dir/runtime.yaml         with runtime=True: the ClusterTrainingRuntime 'pinpoint-tensorflow'
                               the trainjob flavour runs on (cluster-scoped: applied once, by an admin)

The manifests' pods write the same run folder the steps read: out_dir relative to /runs when it
is under it (the claim's mount in every step), else the run's name (pinpoint.provision.manifests).

Restart semantics: exit codes >= 128 are retried by the Training Operator (ExitCode policy,
IsRetryableExitCode since release 1.7) or the plain Jobs' podFailurePolicy; 1..127 are permanent.
train.max_restarts is enforced by the launch step counting pod recreations, because TFJob's
backoffLimit does not count ExitCode restarts.

A multi-process strategy without cluster.runs_volume_claim gets no manifests/ (each pod would
have its own emptyDir: no shared checkpoints); the summary's warnings and the cluster_spec notes
say so in one line.
"""

from __future__ import annotations

import os
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


def _remove_manifests(out: Path) -> None:
    """No manifests for this config: a previous provision's must not be launched with it."""
    final = out / MANIFESTS_DIR
    if final.exists():
        old = Path(tempfile.mkdtemp(dir=out, prefix=".manifests.old."))
        final.rename(old / MANIFESTS_DIR)
        shutil.rmtree(old, ignore_errors=True)


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


def provision(cfg: Config, out_dir, *, nodes=None, kubeconfig=None, rbac=None, runtime: bool = False) -> dict:
    """Write the run folder's provisioning outputs (see the module doc) and return a summary.
    rbac: a ServiceAccount name; also write rbac.yaml (the launch step's Role + RoleBinding for
    that account in the run's namespace).

    Raises ProvisionError (one line) for an impossible request, or when the inventory cannot
    hold every replica; then nothing is written (the error names the replica and the reason) and
    a previous provision's outputs in the folder are left as they were.
    """
    from pinpoint.provision.manifests import build_manifests, check_manifest_inputs, pod_run_rel
    from pinpoint.provision.namespace import namespace_of, with_namespace
    from pinpoint.provision.pods import pod_run_dir
    from pinpoint.provision.rbac import RBAC_FILE, rbac_yaml
    from pinpoint.provision.spec import build_tasks, cluster_spec

    # The run folder's config names its namespace, so every later step and pod uses the same one.
    cfg = with_namespace(cfg)
    tasks = build_tasks(cfg)
    try:
        # What would make the manifests wrong or unsafe (no shared claim for a multi-process run,
        # credentials the ConfigMap would carry, an image a real cluster cannot pull) costs only
        # the manifests: local runs from this folder still work, the launch step refuses the same line.
        check_manifest_inputs(cfg)
    except ProvisionError as err:
        files, pods_dir = None, None
        warnings = [str(err)]  # the image warnings are about manifests: none are written
    else:
        warnings = image_warnings(cfg)
        # The pods write the folder the steps read (the same claim, the same path under /runs).
        rel = pod_run_rel(os.path.abspath(out_dir), cfg.name)
        files, pods_dir = build_manifests(cfg, tasks, run_rel=rel), pod_run_dir(rel)
    spec = cluster_spec(cfg, tasks, pod_run_dir=pods_dir)
    rbac_text = rbac_yaml(namespace_of(cfg.cluster), rbac) if rbac else None
    if runtime:
        from pinpoint.provision.trainjob import runtime_yaml

        runtime_text = runtime_yaml()
    else:
        runtime_text = None
    plan = _feasibility(cfg, tasks, nodes, kubeconfig)

    if plan["status"] == "infeasible":
        # Bad input writes nothing: no half-provisioned folder for a later step to pick up.
        raise ProvisionError(plan["reason"])
    out = ensure_dir(out_dir)
    atomic_write_json(out / PLACEMENT_PLAN, plan)
    atomic_write_text(out / CONFIG_FILE, config_to_yaml(cfg))
    atomic_write_json(out / CLUSTER_SPEC, spec)
    if files is None:
        _remove_manifests(out)
        written = []
    else:
        written = _write_manifests(out, files)
    if rbac_text is not None:
        atomic_write_text(out / RBAC_FILE, rbac_text)
    if runtime_text is not None:
        atomic_write_text(out / "runtime.yaml", runtime_text)
    return {
        "cluster_spec": str(out / CLUSTER_SPEC),
        "manifests": [str(p) for p in written],
        "pod_run_dir": pods_dir,
        "rbac": str(out / RBAC_FILE) if rbac_text is not None else None,
        "runtime": str(out / "runtime.yaml") if runtime_text is not None else None,
        "placement_plan": str(out / PLACEMENT_PLAN),
        "feasibility": plan["status"],
        "tasks": [t.name for t in tasks],
        "config_digest": cfg.digest(),  # of the config written to the run folder (namespace resolved)
        "warnings": warnings,
    }


def image_warnings(cfg: Config) -> list[str]:
    """The manifests' pods import the user's code from the image: say so when the image is a
    stock Pinpoint image, which has none. An emulated run's image without a registry host only
    starts where it was preloaded on the nodes: say so too (a real GPU run's is refused)."""
    from pinpoint.config import is_import_path
    from pinpoint.provision.manifests import is_unqualified_image, unqualified_image_fix

    t, image = cfg.train, cfg.cluster.image
    out = []
    user = [f for f, v in (("train.model", t.model), ("train.data", t.data), ("train.loss", t.loss)) if is_import_path(v)]
    repo = image.rsplit(":", 1)[0].rsplit("/", 1)[-1]
    if user and repo in ("pinpoint-cpu", "pinpoint-gpu"):
        out.append(f"cluster.image: got {image!r}, which does not contain your code ({', '.join(user)}); "
                   f"for the Kubernetes manifests build one with `make images CODE_DIR={t.code_dir}` and set "
                   "cluster.image: pinpoint-user:latest (local runs are not affected)")
    if cfg.cluster.emulate and is_unqualified_image(image):
        out.append(f"cluster.image: got {image!r}, a name without a registry host; the manifests' pods "
                   "(imagePullPolicy IfNotPresent) only start on nodes where it was preloaded (kind load, "
                   f"minikube image load); for any other cluster {unqualified_image_fix(image)}")
    return out
