"""A task of the topology (role, index, address, resources, TF_CONFIG) and what one task of a role
requests; the rules every flavour shares about exit codes and the shared claim."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from pinpoint.config import Config
from pinpoint.provision.quantity import parse_quantity
from pinpoint.provision.tfconfig import to_json


# The Training Operator's ExitCode policy recreates a pod whose container exited with a code
# >= 128 (a signal, or 128+n chosen by the task; IsRetryableExitCode since release 1.7); any
# code 1..127 is permanent (1 an error, 2 bad input...). The plain Jobs' podFailurePolicy
# encodes the same split. Neither counts these recreations the way train.max_restarts means
# (TFJob's backoffLimit ignores ExitCode restarts): the launch step enforces it by counting
# each replica's pod recreations.
def is_retryable_exit_code(code: int) -> bool:
    return code >= 128


# A multi-process run without cluster.runs_volume_claim gets no manifests: every pod would get its
# own emptyDir, so the evaluator would never see a checkpoint and a recreated pod would start at
# step 0 (pods do not restore from MLflow). Provision's warning and cluster_spec note.
NO_CLAIM_LINE = (
    "cluster.runs_volume_claim: got None; multi-process runs on Kubernetes share checkpoints through a "
    "ReadWriteMany claim; set it to get manifests/"
)


@dataclass(frozen=True)
class Resources:
    cpu: str
    memory: str
    gpus: int
    gpu_resource: str
    gpu_type: str | None  # required value of the GPU type label, or None

    def amounts(self) -> dict[str, float]:
        """Numeric requests keyed by resource name (cpu in cores, memory in bytes)."""
        out = {"cpu": float(parse_quantity(self.cpu)), "memory": float(parse_quantity(self.memory))}
        if self.gpus:
            out[self.gpu_resource] = float(self.gpus)
        return out


@dataclass(frozen=True)
class Task:
    role: str
    index: int
    replica_type: str  # TFJob replicaSpecs key
    host: str  # the DNS name the other tasks dial, with the port
    resources: Resources
    tf_config: dict = field(compare=False)
    devices: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.role}:{self.index}"

    def to_json(self) -> dict:
        d = asdict(self)
        d["task"] = self.name
        d["tf_config_json"] = to_json(self.tf_config)
        return d

    def to_spec_json(self) -> dict:
        """The task's entry in cluster_spec.json: its TF_CONFIG without the cluster dict, which the
        file holds once (repeating it per task made the file quadratic in the tasks: 430 KB at 74)."""
        d = {k: v for k, v in self.to_json().items() if k not in ("tf_config", "tf_config_json")}
        d["tf_config"] = {k: v for k, v in self.tf_config.items() if k != "cluster"}
        return d


def role_gpus(cfg: Config, role: str) -> int:
    """GPUs one replica of `role` requests. Emulated or CPU specs request none. A ps task only
    holds variables (host memory); the parameter_server chief only coordinates (dispatches
    functions to workers); an evaluator needs one device to run the model."""
    c = cfg.cluster
    if c.emulate or c.device_type != "GPU" or c.devices_per_worker == 0:
        return 0
    if role == "ps":
        return 0
    if role == "chief" and cfg.train.strategy == "parameter_server":
        return 0
    if role == "evaluator":
        return 1
    return c.devices_per_worker


def role_devices(cfg: Config, role: str) -> tuple[str, ...]:
    """The spec devices one task of `role` computes on (before emulation maps /GPU:i to a
    logical CPU device): replicas use every device of the spec; a ps task and the
    parameter_server coordinator only use the host CPU; an evaluator uses the first device."""
    replica = tuple(cfg.replica_devices())
    if role == "ps" or (role == "chief" and cfg.train.strategy == "parameter_server"):
        return ("/CPU:0",)
    if role == "evaluator":
        return replica[:1]
    return replica


def role_resources(cfg: Config, role: str) -> Resources:
    c = cfg.cluster
    gpus = role_gpus(cfg, role)
    return Resources(c.cpu, c.memory, gpus, c.gpu_resource, c.gpu_type if gpus else None)
