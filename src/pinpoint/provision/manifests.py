"""Kubernetes manifests for a cluster spec: the ConfigMap, and the workload of the run's flavour
(pinpoint.provision.flavours: a TFJob, plain Services + Indexed Jobs, a JobSet, or a Kubeflow
Trainer v2 TrainJob whose runtime holds that JobSet), whose pod is pinpoint.provision.pods'.

Every flavour runs the same container (`pinpoint train /config/config.yaml --out /runs/<rel>
--task <role>:<index>`) with the same TF_CONFIG: the TFJob's comes from the Training Operator,
the plain and JobSet ones from `pinpoint.provision.podenv`, which rebuilds the operator's JSON
from the Indexed Job's completion index (with the JobSet's pod hosts for a JobSet).

Run folder: the pods mount cluster.runs_volume_claim with `subPath: <rel>` at `/runs/<rel>` and
write there, where <rel> is the provisioned run folder relative to RUNS_MOUNT (/runs) when it is
under it (the pipeline's steps, which mount the same claim at /runs), else the run's name
(`pod_run_rel`). So a step's run_dir, a custom one or a sweep variant's '<run_dir>/<variant>',
is exactly the folder its pods write.

Restart semantics: a multi-worker collective cannot continue with a replaced member, so a task
that loses a peer exits with RETRY_EXIT_CODE (138) and is recreated, and the group restarts from
the latest checkpoint on the shared claim. Exit codes >= 128 are retried (the Training
Operator's ExitCode policy, IsRetryableExitCode since release 1.7; the plain Jobs'
podFailurePolicy); codes 1..127 (configuration and code errors) are permanent. The operator does
not count ExitCode recreations against runPolicy.backoffLimit, so train.max_restarts is enforced
by the launch step (pinpoint.k8s.launch), which counts each replica's pod recreations.
A JobSet restarts the whole group itself (every child Job recreated, `status.restarts` counted
up to failurePolicy.maxRestarts = train.max_restarts); the launch step only watches it.
"""

from __future__ import annotations

import posixpath

import yaml

from pinpoint.config import MULTI_PROCESS_STRATEGIES, Config, config_to_yaml
from pinpoint.errors import ProvisionError
from pinpoint.provision.flavours import flavour_of
from pinpoint.provision.names import EXAMPLE_REGISTRY, labels
from pinpoint.provision.namespace import namespace_of
from pinpoint.provision.podenv import uri_has_credentials
from pinpoint.provision.tasks import NO_CLAIM_LINE, Task
from pinpoint.runfolder import RUNS_MOUNT


def pod_run_rel(out_dir, name: str, runs_mount: str = RUNS_MOUNT) -> str:
    """The pods' run folder relative to the claim's root: `out_dir` relative to `runs_mount`
    when it is under it (where the pipeline's steps mount the claim), else `name` (a folder
    elsewhere, e.g. `pinpoint provision --out runs/x` on a laptop for kubectl apply).
    Pure: `out_dir` is an absolute path string, nothing is read from the file system."""
    path = posixpath.normpath(str(out_dir))
    root = posixpath.normpath(runs_mount)
    if posixpath.isabs(path) and path != root and path.startswith(root.rstrip("/") + "/"):
        return posixpath.relpath(path, root)
    return name


def is_unqualified_image(image: str) -> bool:
    """True for an image name without a registry host ('pinpoint-cpu:latest', 'team/app:1'):
    the first path component of a qualified name has a '.' or ':' or is 'localhost'."""
    first, sep, _ = image.partition("/")
    return not sep or not ("." in first or ":" in first or first == "localhost")


def unqualified_image_fix(image: str) -> str:
    repo = image.rsplit("/", 1)[-1].split("@", 1)[0].split(":", 1)[0]
    return f"push it to a registry and use {EXAMPLE_REGISTRY}/{repo}:TAG"


def check_manifest_inputs(cfg: Config) -> None:
    """What makes manifests wrong or unsafe, refused with one line each."""
    c = cfg.cluster
    if cfg.train.strategy in MULTI_PROCESS_STRATEGIES and not c.runs_volume_claim:
        raise ProvisionError(NO_CLAIM_LINE)
    if uri_has_credentials(cfg.tracking.uri):
        # The ConfigMap embeds config.yaml: a password in tracking.uri would be readable by anyone
        # who can read ConfigMaps (and printed by every pod). The value itself is never echoed.
        where = f"the Kubernetes Secret '{c.mlflow_secret}'" if c.mlflow_secret else "a Secret named by cluster.mlflow_secret"
        raise ProvisionError(
            "tracking.uri: got a URI with credentials (user:password@host); the manifests' ConfigMap embeds the "
            f"config, so remove them from the URI and put them in {where} (keys username, password)"
        )
    if not c.emulate and is_unqualified_image(c.image):
        raise ProvisionError(
            f"cluster.image: got {c.image!r}, a name without a registry host, which the nodes of a real "
            f"(emulate: false) cluster can only run if it was preloaded on each of them (imagePullPolicy "
            f"IfNotPresent); {unqualified_image_fix(c.image)}"
        )


def configmap(cfg: Config) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{cfg.name}-config", "namespace": namespace_of(cfg.cluster), "labels": labels(cfg)},
        "data": {"config.yaml": config_to_yaml(cfg)},
    }


def build_manifests(cfg: Config, tasks: list[Task], *, run_rel: str | None = None) -> dict[str, list[dict]]:
    """File name -> documents: the ConfigMap and cfg.cluster.flavor's workload; the pods write
    /runs/<run_rel> on the claim (default: the run's name, see `pod_run_rel`). ProvisionError
    (one line) for what check_manifest_inputs refuses."""
    check_manifest_inputs(cfg)
    return {"configmap.yaml": [configmap(cfg)], **flavour_of(cfg).manifests(cfg, tasks, run_rel)}


def dump(docs: list[dict]) -> str:
    return yaml.safe_dump_all(docs, sort_keys=False, default_flow_style=False)
