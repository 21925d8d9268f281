"""Compile-time settings of the pipelines: image, GPUs, scheduling, storage and secrets.

kfp fixes accelerators, node selectors, tolerations and secrets when the pipeline is compiled,
so they come from a config (`settings_from_config`) rather than from run-time parameters. The
cluster's own fields (image, GPU resource, tolerations, CPU and memory, /dev/shm, the claim and
the MLflow Secret) are read from its ClusterConfig, never copied under other names; only what
the pipeline decides itself lives here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pinpoint.config import DEFAULT_RUNS_CLAIM, ClusterConfig, Toleration

# The Secret's keys are the library's: the training pods (manifests) read the same Secret.
from pinpoint.provision.podenv import MLFLOW_SECRET_KEYS, uri_has_credentials
from pinpoint.runfolder import RUNS_MOUNT

__all__ = ["MLFLOW_SECRET_KEYS", "RUNS_MOUNT", "PipelineSettings", "Toleration", "local_settings", "settings_from_config"]


@dataclass(frozen=True)
class PipelineSettings:
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    # 'local': the train step trains inside its own pod/container (GPUs requested for it);
    # 'kubernetes': the train step applies the provisioned manifests (the TFJob's pods get the GPUs).
    launch: str = "local"
    kubernetes: bool = False  # add the kfp-kubernetes platform config (off for kfp.local)
    # Defaults of the compiled pipeline's parameters (so it can be started from the KFP UI).
    default_config_yaml: str = ""
    default_run_dir: str = ""

    @property
    def image(self) -> str:
        return self.cluster.image

    @property
    def gpu_count(self) -> int:
        """GPUs the train step's own pod requests: real GPUs trained in-pod (launch 'local')."""
        c = self.cluster
        real_gpus = c.device_type == "GPU" and not c.emulate and c.devices_per_worker > 0
        return c.devices_per_worker if real_gpus and self.launch == "local" else 0

    @property
    def node_selector(self) -> tuple[tuple[str, str], ...]:
        """The in-pod training step's node selector: the config's, plus the GPU type's label."""
        if self.launch != "local":
            return ()
        c = self.cluster
        selector = dict(c.node_selector)
        if self.gpu_count and c.gpu_type:
            selector[c.gpu_type_label] = c.gpu_type
        return tuple(sorted(selector.items()))

    @property
    def tolerations(self) -> tuple[Toleration, ...]:
        return self.cluster.tolerations if self.launch == "local" else ()

    @property
    def shm_size(self) -> str:
        """/dev/shm (memory emptyDir) for in-pod GPU training (NCCL needs it)."""
        return self.cluster.shm_size if self.gpu_count else ""

    @property
    def runs_pvc(self) -> str:
        """The PVC holding the run folders, mounted at RUNS_MOUNT on every step (Kubernetes only)."""
        return (self.cluster.runs_volume_claim or DEFAULT_RUNS_CLAIM) if self.kubernetes else ""

    @property
    def mlflow_secret(self) -> str:
        """The Secret with MLFLOW_SECRET_KEYS, exposed to the steps as env vars (optional keys)."""
        return self.cluster.mlflow_secret or ""


def local_settings() -> PipelineSettings:
    """kfp.local: no Kubernetes settings; the image name only matters for DockerRunner."""
    return PipelineSettings()


def settings_from_config(cfg) -> PipelineSettings:
    """Settings for a Kubernetes cluster, from a pinpoint Config. The steps share the run folder
    through the PVC cluster.runs_volume_claim (default DEFAULT_RUNS_CLAIM, ReadWriteMany) and read
    MLflow's connection from the Secret cluster.mlflow_secret, as the training pods do."""
    from pinpoint.config import MULTI_PROCESS_STRATEGIES, config_to_yaml
    from pinpoint.errors import ConfigError

    c = cfg.cluster
    if uri_has_credentials(cfg.tracking.uri):
        # The config becomes a default in the compiled YAML: credentials must come from the Secret.
        where = f"the Kubernetes Secret '{c.mlflow_secret}'" if c.mlflow_secret else "a Secret named by cluster.mlflow_secret"
        raise ConfigError(
            "tracking.uri: got a URI with credentials; remove the user:password part "
            f"and put them in {where} (keys username, password)"
        )
    launch = "kubernetes" if cfg.train.strategy in MULTI_PROCESS_STRATEGIES else "local"
    if launch == "kubernetes" and not c.runs_volume_claim:
        # The TFJob's pods write placement.json/metrics.json where the pipeline's steps read them.
        raise ConfigError(
            "cluster.runs_volume_claim: got None; on Kubernetes the training pods and the "
            "pipeline steps share the run folder through a ReadWriteMany PVC; set cluster.runs_volume_claim: "
            f"{DEFAULT_RUNS_CLAIM} (and create that claim)"
        )
    return PipelineSettings(
        cluster=c,
        launch=launch,
        kubernetes=True,
        default_config_yaml=config_to_yaml(cfg),
        default_run_dir=f"{RUNS_MOUNT}/{cfg.name}",
    )
