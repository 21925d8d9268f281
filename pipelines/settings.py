"""Compile-time settings of the pipelines: image, GPUs, scheduling, storage and secrets.

kfp fixes accelerators, node selectors, tolerations and secrets when the pipeline is compiled,
so they come from a config (`settings_from_config`) rather than from run-time parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

from components import DEFAULT_IMAGE
from pinpoint.config import ClusterConfig

# The Secret's keys are the library's: the training pods (manifests) read the same Secret.
from pinpoint.provision.podenv import MLFLOW_SECRET_KEYS, uri_has_credentials
from pinpoint.runfolder import RUNS_MOUNT

__all__ = ["MLFLOW_SECRET_KEYS", "RUNS_MOUNT", "PipelineSettings", "Toleration", "local_settings", "settings_from_config"]


@dataclass(frozen=True)
class Toleration:
    key: str
    operator: str = "Equal"
    value: str | None = None
    effect: str | None = None


@dataclass(frozen=True)
class PipelineSettings:
    image: str = DEFAULT_IMAGE
    # 'local': the train step trains inside its own pod/container (GPUs requested for it);
    # 'kubernetes': the train step applies the provisioned manifests (the TFJob's pods get the GPUs).
    launch: str = "local"
    gpu_count: int = 0
    accelerator_type: str = "nvidia.com/gpu"
    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    shm_size: str = ""  # /dev/shm (memory emptyDir) for in-pod GPU training (NCCL needs it)
    cpu_limit: str = "2"
    memory_limit: str = "4G"
    runs_pvc: str = ""  # PVC holding the run folders, mounted at /runs on every step
    mlflow_secret: str = ""  # Secret with MLFLOW_SECRET_KEYS, exposed as env vars (optional keys)
    kubernetes: bool = False  # add the kfp-kubernetes platform config (off for kfp.local)
    # Defaults of the compiled pipeline's parameters (so it can be started from the KFP UI).
    default_config_yaml: str = ""
    default_run_dir: str = ""


def local_settings() -> PipelineSettings:
    """kfp.local: no Kubernetes settings; the image name only matters for DockerRunner."""
    return PipelineSettings()


DEFAULT_RUNS_PVC = "pinpoint-runs"
# The config's default Secret (cluster.mlflow_secret), for a pipeline compiled without a config.
DEFAULT_MLFLOW_SECRET = ClusterConfig.model_fields["mlflow_secret"].default


def settings_from_config(cfg) -> PipelineSettings:
    """Settings for a Kubernetes cluster, from a pinpoint Config. The steps share the run folder
    through the PVC cluster.runs_volume_claim (default 'pinpoint-runs', ReadWriteMany) and read
    MLflow's connection from the Secret cluster.mlflow_secret, as the training pods do."""
    runs_pvc = cfg.cluster.runs_volume_claim or DEFAULT_RUNS_PVC
    mlflow_secret = cfg.cluster.mlflow_secret or ""
    from pinpoint.config import config_to_yaml
    from pinpoint.errors import ConfigError

    if uri_has_credentials(cfg.tracking.uri):
        # The config becomes a default in the compiled YAML: credentials must come from the Secret.
        where = f"the Kubernetes Secret '{mlflow_secret}'" if mlflow_secret else "a Secret named by cluster.mlflow_secret"
        raise ConfigError(
            "tracking.uri: got a URI with credentials; remove the user:password part "
            f"and put them in {where} (keys username, password)"
        )
    c = cfg.cluster
    multi_process = cfg.train.strategy in ("multi_worker_mirrored", "parameter_server")
    real_gpus = c.device_type == "GPU" and not c.emulate and c.devices_per_worker > 0
    selector = dict(c.node_selector)
    if real_gpus and c.gpu_type:
        selector[c.gpu_type_label] = c.gpu_type
    launch = "kubernetes" if multi_process else "local"
    if launch == "kubernetes" and not c.runs_volume_claim:
        # The TFJob's pods write placement.json/metrics.json where the pipeline's steps read them.
        raise ConfigError(
            "cluster.runs_volume_claim: got None; on Kubernetes the training pods and the "
            "pipeline steps share the run folder through a ReadWriteMany PVC; set cluster.runs_volume_claim: "
            f"{DEFAULT_RUNS_PVC} (and create that claim)"
        )
    in_pod_gpus = c.devices_per_worker if real_gpus and launch == "local" else 0
    return PipelineSettings(
        image=c.image,
        launch=launch,
        gpu_count=in_pod_gpus,
        accelerator_type=c.gpu_resource,
        node_selector=tuple(sorted(selector.items())) if launch == "local" else (),
        tolerations=tuple(Toleration(t.key, t.operator, t.value, t.effect) for t in c.tolerations)
        if launch == "local"
        else (),
        shm_size=c.shm_size if in_pod_gpus else "",
        cpu_limit=c.cpu,
        memory_limit=_kfp_memory(c.memory),
        runs_pvc=runs_pvc,
        mlflow_secret=mlflow_secret,
        kubernetes=True,
        default_config_yaml=config_to_yaml(cfg),
        default_run_dir=f"{RUNS_MOUNT}/{cfg.name}" if runs_pvc else "",
    )


def _kfp_memory(value: str) -> str:
    """kfp accepts 'E|P|T|G|M|K' with optional 'i'; Kubernetes quantities are the same set."""
    return value
