"""Typed, frozen, validated run configuration (one YAML file).

Every error is one line naming the field, the value received and the fix, raised as
:class:`pinpoint.errors.ConfigError`. Nothing here reads the environment.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Literal, NamedTuple, Optional, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from pinpoint import __version__, config_scope, layer_keys
from pinpoint.device_names import parse_device
from pinpoint.errors import ConfigError

STRATEGIES = (
    "none",
    "one_device",
    "mirrored",
    "multi_worker_mirrored",
    "central_storage",
    "parameter_server",
)
MODELS = ("mlp", "cnn", "transformer")
# A user callable: "package.module:callable" (train.model, train.data, train.loss).
IMPORT_PATH_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")
LOSSES = ("sparse_categorical_crossentropy", "categorical_crossentropy", "binary_crossentropy", "mse", "mae")
# Streamed file sources of train.data: "<prefix>:<glob or folder>".
FILE_SOURCES = ("tfrecord", "csv", "parquet", "images")
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
# Layer names of each model (the keys of train.pinning.layers); training/loop/models.py builds
# exactly these (a test keeps the two in sync), so a typo is caught at config load.
MODEL_LAYERS = {
    "mlp": ("dense_1", "dense_2", "head"),
    "cnn": ("reshape", "conv_1", "conv_2", "pool", "flatten", "dense_1", "head"),
    "transformer": ("embed", "block_0", "block_1", "pool", "head"),
}
class FlavorRules(NamedTuple):
    """What validating a config needs to know of a Kubernetes flavour; its class
    (pinpoint.provision.flavours, a layer above) owns everything else."""

    gangs: tuple[str, ...]  # the cluster.gang values it can express
    one_object: bool  # one workload object holds every role (plain: one Job per role)


# cluster.flavor -> its rules; the names are the registry of pinpoint.provision.flavours.
FLAVOR_RULES = {
    "tfjob": FlavorRules(("off", "operator", "kueue"), True),
    "plain": FlavorRules(("off", "kueue"), False),
    "jobset": FlavorRules(("off", "kueue"), True),
    "trainjob": FlavorRules(("off", "kueue"), True),
}
FLAVORS = tuple(FLAVOR_RULES)
MULTI_PROCESS_STRATEGIES = ("multi_worker_mirrored", "parameter_server")
# train.all_reduce: TensorFlow's cross-device ops (mirrored) / collective implementation
# (multi_worker_mirrored) for the gradient all-reduce (training/strategies.py maps them).
ALL_REDUCE = ("auto", "nccl", "hierarchical_copy", "reduce_to_host", "ring")

# The one name of the default image (cluster.image, the kfp components, the tests' local build):
# the CPU image `make images` tags with the package's version.
DEFAULT_IMAGE = f"pinpoint-cpu:{__version__}"
# The run-folder claim the pipeline's steps mount when cluster.runs_volume_claim is unset (a
# single-process run trains inside the train step's pod; the steps still share the run folder).
DEFAULT_RUNS_CLAIM = "pinpoint-runs"

# Defaults the launch step shares (pinpoint.k8s.options.LaunchOptions): defined here only.
UNSCHEDULABLE_GRACE_S = 600.0  # a GPU node pool scaling up from zero takes minutes
DEADLINE_S = 86400

DNS1123_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# A Kubernetes resource quantity (cpu "500m", "2"; memory "4Gi", "512M", "1e9").
QUANTITY_RE = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei|[eE][0-9]+)?$")
# Ports a TF server must not take inside a pod: the Istio sidecar's ports (15000-15090: a
# namespace policy can inject it even with sidecar.istio.io/inject=false).
RESERVED_PORTS = {15000: "Istio admin", 15001: "Istio outbound", 15004: "Istio debug",
                  15006: "Istio inbound", 15008: "Istio HBONE", 15020: "Istio merged metrics",
                  15021: "Istio health", 15053: "Istio DNS", 15090: "Istio Prometheus"}


def _check_device(value: Optional[str]) -> Optional[str]:
    if value is None:
        return None
    parse_device(value)
    return value


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)


class Toleration(_Frozen):
    key: str
    operator: Literal["Equal", "Exists"] = "Equal"
    value: Optional[str] = None
    effect: Optional[Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]] = None


class ClusterConfig(_Frozen):
    """Topology request: roles, devices per replica and how to run them on Kubernetes."""

    chief: int = Field(1, ge=0)  # at most 1: checked in _check_strategy_vs_cluster
    # Parameter-server training of recommendation models runs hundreds of workers; the manifests,
    # cluster_spec.json and the launch step's requests per poll stay linear (or constant) in tasks.
    workers: int = Field(0, ge=0, le=1024)
    ps: int = Field(0, ge=0, le=64)
    evaluator: int = Field(0, ge=0)  # at most 1: checked in _check_strategy_vs_cluster
    devices_per_worker: int = Field(1, ge=0, le=16)
    device_type: Literal["GPU", "CPU"] = "GPU"
    emulate: bool = True
    gpu_resource: str = "nvidia.com/gpu"
    gpu_type: Optional[str] = None
    # Each GPU's memory ("16GiB", "80GB"): with placement.memory, a fits verdict per device (docs/memory.md).
    gpu_memory: Optional[str] = None
    gpu_type_label: str = "nvidia.com/gpu.product"
    cpu: str = "2"
    memory: str = "4Gi"
    shm_size: str = "1Gi"
    tolerations: tuple[Toleration, ...] = ()
    node_selector: dict[str, str] = Field(default_factory=dict)
    image: str = DEFAULT_IMAGE
    # Secrets of type kubernetes.io/dockerconfigjson the pods pull cluster.image with.
    image_pull_secrets: tuple[str, ...] = ()
    # None: the namespace of the pod that runs the step (its service-account namespace file), or
    # 'default' outside a cluster; resolved once by provision (pinpoint.provision.namespace).
    namespace: Optional[str] = None
    port: int = Field(2222, ge=1024, le=65535)
    cluster_domain: Optional[str] = None
    # What the manifests hold (docs/kubernetes.md compares them): 'tfjob' a Training Operator 1.x
    # TFJob; 'plain' Indexed Jobs + headless Services; 'jobset' one JobSet (jobset.x-k8s.io) that
    # restarts the whole group itself; 'trainjob' a Kubeflow Trainer v2 TrainJob on Pinpoint's
    # 'pinpoint-tensorflow' ClusterTrainingRuntime (which instantiates that JobSet).
    flavor: Literal[FLAVORS] = "tfjob"  # type: ignore[valid-type]
    # PersistentVolumeClaim (ReadWriteMany) holding the run folders: the pipeline steps mount it at
    # /runs, the training pods the run's own folder (subPath), so checkpoints are shared and survive
    # pod restarts. Required for multi-process strategies on Kubernetes; None: an emptyDir per pod
    # (and the pipeline's steps mount DEFAULT_RUNS_CLAIM).
    runs_volume_claim: Optional[str] = None
    # How long a pod may stay unschedulable before the launch step gives up (a GPU node pool
    # scaling up from zero takes minutes).
    unschedulable_grace_s: float = Field(UNSCHEDULABLE_GRACE_S, ge=0)
    # activeDeadlineSeconds of the TFJob/Jobs (the cluster stops a run that outlives its launcher)
    # and the launch step's own timeout.
    deadline_s: int = Field(DEADLINE_S, ge=60)
    # ttlSecondsAfterFinished: finished TFJobs/Jobs (and their pods' logs) are removed after this.
    ttl_after_finished_s: int = Field(3600, ge=0)
    # Secret holding the MLflow connection (keys tracking-uri, username, password; each
    # optional), given to the training pods as it is to the pipeline's steps. None: no Secret.
    mlflow_secret: Optional[str] = "mlflow-credentials"
    # All-or-nothing scheduling, so half a job cannot hold GPUs while the rest waits:
    # 'kueue' labels the TFJob with cluster.queue (Kueue admits it as one workload);
    # 'operator' sets the TFJob's runPolicy.schedulingPolicy.minAvailable (the Training
    # Operator started with a gang scheduler: Volcano or scheduler-plugins).
    gang: Literal["off", "kueue", "operator"] = "off"
    queue: Optional[str] = None  # Kueue LocalQueue (gang: kueue) or the gang scheduler's queue

    @field_validator("namespace")
    @classmethod
    def _dns(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and (not DNS1123_RE.match(v) or len(v) > 63):
            raise ValueError(
                f"'{v}' is not a DNS-1123 label; use lower-case letters, digits and '-' (max 63)"
            )
        return v

    @field_validator("cpu", "memory", "shm_size", mode="before")
    @classmethod
    def _quantity(cls, v: Any) -> str:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            v = str(v)  # YAML `cpu: 4` is a number; Kubernetes wants the quantity string
        if not QUANTITY_RE.match(str(v)):
            raise ValueError(f"'{v}' is not a Kubernetes quantity; write it like '2', '500m', '4Gi' or '512Mi'")
        return str(v)

    @field_validator("port")
    @classmethod
    def _port(cls, v: int) -> int:
        if v in RESERVED_PORTS:
            raise ValueError(f"port {v} is reserved ({RESERVED_PORTS[v]}); use another port such as 2222")
        return v

    @field_validator("cluster_domain")
    @classmethod
    def _domain(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and (not DNS1123_SUBDOMAIN_RE.match(v) or len(v) > 253):
            raise ValueError(f"'{v}' is not a DNS domain; write it like 'cluster.local' (no leading dot)")
        return v

    @field_validator("image_pull_secrets")
    @classmethod
    def _secrets(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for name in v:
            if not DNS1123_SUBDOMAIN_RE.match(name) or len(name) > 253:
                raise ValueError(f"'{name}' is not a Secret name; use lower-case letters, digits, '-' and '.'")
        return v

    @field_validator("runs_volume_claim", "mlflow_secret", "queue")
    @classmethod
    def _claim(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and (not DNS1123_SUBDOMAIN_RE.match(v) or len(v) > 253):
            raise ValueError(f"'{v}' is not a Kubernetes object name; use lower-case letters, digits, '-' and '.'")
        return v

    @property
    def replicas(self) -> int:
        """Number of tasks that run training steps (chief + workers)."""
        return self.chief + self.workers


class PinningConfig(_Frozen):
    """Explicit device pinning; every value is a TensorFlow device string."""

    variables: Optional[str] = None
    gradients: Optional[str] = None
    layers: dict[str, str] = Field(default_factory=dict)
    # With layers pinned: "follow" runs each layer's backward ops on the layer's device (TF's
    # colocation of gradients with their forward ops); "default" places them by the device scope
    # of the gradient call (the host, or the first GPU on a GPU machine).
    layers_backward: Literal["follow", "default"] = "follow"
    input: Optional[str] = None
    soft_placement: bool = True
    visible_devices: Optional[tuple[str, ...]] = None

    @field_validator("variables", "gradients", "input")
    @classmethod
    def _device(cls, v: Optional[str]) -> Optional[str]:
        return _check_device(v)

    @field_validator("layers")
    @classmethod
    def _layers(cls, v: dict[str, str]) -> dict[str, str]:
        for device in v.values():
            parse_device(device)
        return v

    @field_validator("visible_devices")
    @classmethod
    def _visible(cls, v):
        if v is not None:
            for device in v:
                parse_device(device)
        return v


class PlacementConfig(_Frozen):
    """When to capture the placement the runtime really used.

    The sampled steps are warmup_steps .. warmup_steps + sample_steps - 1 (counted from the
    first step of this process). Their graphs are recorded when the training function is
    instantiated, so they are reported only if training reaches them; parameter_server runs
    one extra real step per sample from the coordinator."""

    enabled: bool = True
    warmup_steps: int = Field(3, ge=1)
    sample_steps: int = Field(1, ge=1, le=100)
    # Time per device over the sampled steps: they run as their own call under TensorFlow's
    # profiler (placement.json `timing`, the trace in <run>/profile/). Off: nothing extra runs.
    timing: bool = False
    # Memory per device over the same profiled call (placement.json `memory`, docs/memory.md): the
    # tasks start with the allocator that traces every allocation. Off: nothing extra runs.
    memory: bool = False

    @model_validator(mode="after")
    def _timing_needs_capture(self) -> "PlacementConfig":
        for name in ("timing", "memory"):
            if getattr(self, name) and not self.enabled:
                _fail(f"placement.{name}", True, f"set placement.enabled: true ({name} is measured on the sampled "
                      f"steps and attributed with their graphs) or set placement.{name}: false")
        return self


class FeatureSpec(_Frozen):
    """One TFRecord feature (a tf.io.FixedLenFeature)."""

    shape: tuple[int, ...] = ()
    dtype: Literal["float32", "int64", "string"] = "float32"


def is_import_path(value: str) -> bool:
    return bool(IMPORT_PATH_RE.match(value))


def file_source(data: str) -> tuple[str, str] | None:
    """('tfrecord', '/abs/glob') for a streamed file source, else None."""
    kind, sep, rest = data.partition(":")
    return (kind, rest) if sep and kind in FILE_SOURCES else None


class TrainConfig(_Frozen):
    strategy: Literal[STRATEGIES] = "mirrored"  # type: ignore[valid-type]
    pinning: PinningConfig = Field(default_factory=PinningConfig)
    # Your own training code as the train step: "package.module:function", called as function(ctx)
    # (pinpoint.training.entrypoint.context.EntrypointContext; docs/trace.md). The loop's fields are then
    # refused if written (config_scope.NO_EFFECT).
    entrypoint: Optional[str] = None
    entrypoint_args: Union[dict[str, Any], list[str]] = Field(default_factory=dict)  # ctx.args, as given
    # A built-in model name or "package.module:callable" returning a keras.Model.
    model: str = "mlp"
    model_args: dict[str, Any] = Field(default_factory=dict)
    # Put first on sys.path in every task; load_config makes it absolute (default: the config's
    # folder). PINPOINT_CODE_DIR (set in a user image) takes precedence at run time.
    code_dir: Optional[str] = None
    data: str = "digits"
    data_args: dict[str, Any] = Field(default_factory=dict)
    features: dict[str, FeatureSpec] = Field(default_factory=dict)
    label_column: str = "label"
    num_classes: Optional[int] = Field(None, ge=1)
    shuffle_buffer: int = Field(10000, ge=1)
    loss: str = "sparse_categorical_crossentropy"
    from_logits: bool = True
    metrics: Optional[tuple[Literal["accuracy"], ...]] = None  # None: accuracy where the loss allows it
    precision: Literal[PRECISIONS] = "float32"  # type: ignore[valid-type]
    synthetic_examples: int = Field(2048, ge=1)
    batch_size: int = Field(64, ge=1)
    learning_rate: float = Field(0.05, gt=0)
    optimizer: Literal["sgd", "adam"] = "sgd"
    steps: int = Field(300, ge=1)
    checkpoint_every: int = Field(100, ge=0)
    keep_checkpoints: int = Field(3, ge=1)
    max_restarts: int = Field(2, ge=0)
    # multi_worker_mirrored: abort an all-reduce that waits longer than this for its peers (the
    # task exits 138 and the group restarts), for a peer that hangs without dying. Off by default:
    # TensorFlow holds one sleeping thread per collective for the whole timeout (collectives per
    # second x timeout threads), and a peer that dies or is cut off is detected without it (the
    # coordination service's heartbeats). Given to the local tasks and the pods alike.
    collective_timeout_s: Optional[int] = Field(None, ge=1)
    seed: int = 0
    log_every: int = Field(10, ge=1)
    # XLA for each replica's forward+backward on the fast path. None = auto (like Keras fit):
    # on for a built-in model under none/one_device when no variables/gradients/layers pinning
    # needs per-op placement; off for a user model unless set to true.
    jit_compile: Optional[bool] = None
    # How gradients are all-reduced across replicas (mirrored, multi_worker_mirrored); see
    # ALL_REDUCE. auto: ring among emulated GPUs, reduce to the host among CPUs, NCCL on real GPUs
    # (mirrored); TensorFlow's choice (multi_worker_mirrored).
    all_reduce: Literal[ALL_REDUCE] = "auto"  # type: ignore[valid-type]

    @field_validator("entrypoint")
    @classmethod
    def _entrypoint(cls, v: Optional[str]) -> Optional[str]:
        if v is None or is_import_path(v):
            return v
        raise ValueError(f"'{v}' is not an entrypoint; write it as 'package.module:function' (called as function(ctx))")

    @field_validator("model")
    @classmethod
    def _model(cls, v: str) -> str:
        if v in MODELS or is_import_path(v):
            return v
        raise ValueError(
            f"'{v}' is not a model; use one of {', '.join(MODELS)} or an import path 'package.module:callable'"
        )

    @field_validator("data")
    @classmethod
    def _data(cls, v: str) -> str:
        if v in ("digits", "synthetic") or v.endswith((".npz", ".csv")) or is_import_path(v):
            return v
        src = file_source(v)
        if src and src[1]:
            return v
        raise ValueError(
            f"'{v}' is not a data source; use 'digits', 'synthetic', a .npz/.csv path, "
            "'tfrecord:GLOB', 'csv:GLOB', 'parquet:GLOB', 'images:DIR' or 'package.module:callable'"
        )

    @field_validator("loss")
    @classmethod
    def _loss(cls, v: str) -> str:
        if v in LOSSES or is_import_path(v):
            return v
        raise ValueError(f"'{v}' is not a loss; use one of {', '.join(LOSSES)} or 'package.module:callable'")

    @property
    def builtin_model(self) -> bool:
        return self.model in MODELS

    @property
    def takes_data_args(self) -> bool:
        """train.data reads train.data_args: the user's callable (its arguments) or an image folder."""
        return is_import_path(self.data) or (file_source(self.data) or ("",))[0] == "images"

    @property
    def streamed(self) -> bool:
        """Data read through tf.data (user callable or files), not held in memory."""
        return is_import_path(self.data) or file_source(self.data) is not None


class TrackingConfig(_Frozen):
    enabled: bool = True
    uri: Optional[str] = None  # None: local store inside the repo (mlruns/); else a server URI
    experiment: str = "pinpoint"
    # Step metrics (the trainer's logged steps, Keras fit's batches, pinpoint.log) reach MLflow
    # at most once per this many seconds per metric, the latest value of each kept and sent at
    # the next send and at the end: the sender's work is bounded by time whatever the step rate
    # (train_log.jsonl keeps every logged step). 0: every logged step.
    step_metrics_every_s: float = Field(1.0, ge=0, le=3600)
    # ... except the first this many sends of step metrics, which go out as logged: a short run
    # draws a curve (the demo's 300 steps, logged every 10, give 31 points), a long one adds at
    # most one point a second after them. 0: thinned by time from the first step.
    step_metrics_budget: int = Field(50, ge=0, le=100_000)
    # Checkpoints reach MLflow at most once per this many seconds: the newest one when the time
    # has come, and the last one held back at the end of the run, so a run writing checkpoints
    # every few steps uploads a few a minute, not tens a second (each is ~3 files, ~7 ms of the
    # sender's CPU on a server). Every checkpoint is still written to the run folder and kept as
    # train.checkpoint_every / the checkpoint manager say. 0: every checkpoint.
    checkpoints_every_s: float = Field(10.0, ge=0, le=86400)
    log_model: bool = True  # log the final model (MLflow keras flavor) at the end of training

    @model_validator(mode="before")
    @classmethod
    def _one_cadence(cls, data: Any) -> Any:
        """tracking.metrics_interval_s overlapped step_metrics_every_s (both a time between step
        metrics reaching MLflow): the journal is now sent once a second (SEND_INTERVAL_S)."""
        if isinstance(data, dict) and "metrics_interval_s" in data:
            _fail("tracking.metrics_interval_s", data["metrics_interval_s"], "removed: step metrics reach MLflow "
                  "at most once per tracking.step_metrics_every_s, the one cadence setting; set that instead")
        return data


class Config(_Frozen):
    name: str
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    placement: PlacementConfig = Field(default_factory=PlacementConfig)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not DNS1123_RE.match(v) or len(v) > 40:
            raise ValueError(
                f"'{v}' is not a DNS-1123 name; use lower-case letters, digits and '-' (max 40)"
            )
        if not v[0].isalpha():
            # '<name>-<role>-<index>' names Kubernetes Services, which must be DNS-1035 labels.
            raise ValueError(f"'{v}' must start with a letter (it names Kubernetes Services); e.g. 'run-{v}'")
        return v

    @model_validator(mode="after")
    def _cross_checks(self) -> "Config":
        unused = config_scope.no_effect(self)  # first: a field the path ignores is not checked further
        if unused:
            _fail(*unused)
        _check_strategy_vs_cluster(self)
        _check_pinning_vs_strategy(self)
        _check_data(self)
        _check_all_reduce(self)
        _check_scheduling(self)
        _check_gpu_memory(self)
        return self

    # ---- derived -----------------------------------------------------------------
    def digest(self) -> str:
        """A stable short hash of the config (for caching keys and MLflow params)."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def replica_devices(self) -> list[str]:
        """The devices one task trains on, as written in the spec (e.g. ['/GPU:0', '/GPU:1'])."""
        c = self.cluster
        if c.devices_per_worker == 0:
            return ["/CPU:0"]
        return [f"/{c.device_type}:{i}" for i in range(c.devices_per_worker)]


def _fail(field: str, value: Any, fix: str) -> None:
    """A cross-field check failed: the error carries the field it names (pydantic would
    otherwise report the model itself as the location)."""
    raise PydanticCustomError("pinpoint_field", "{fix}", {"field": field, "value": repr(value), "fix": fix})


def _check_gpu_memory(cfg: Config) -> None:
    """cluster.gpu_memory: a size with a unit, and only where the verdict is made (placement.memory)."""
    size = cfg.cluster.gpu_memory
    if size is None:
        return
    from pinpoint.sizes import parse_size

    try:
        parse_size(size, "cluster.gpu_memory")
    except ConfigError as err:
        _fail("cluster.gpu_memory", size, str(err).split("; ", 1)[-1])
    if not cfg.placement.memory:
        _fail("cluster.gpu_memory", size, "the fits verdict is made from the measured memory: set placement.memory: "
              "true, or remove cluster.gpu_memory")


def _check_strategy_vs_cluster(cfg: Config) -> None:
    c, s = cfg.cluster, cfg.train.strategy
    if c.chief > 1:
        _fail("cluster.chief", c.chief, "TF_CONFIG allows at most one chief; set chief: 1 and put the other replicas in cluster.workers")
    if c.evaluator > 1:
        _fail("cluster.evaluator", c.evaluator, "TensorFlow runs at most one side-car evaluator; set cluster.evaluator: 1")
    if c.chief + c.workers == 0:
        _fail("cluster.workers", c.workers, "a cluster needs at least one chief or worker")
    if s == "parameter_server":
        if c.ps < 1:
            _fail("cluster.ps", c.ps, "parameter_server needs at least one ps task; set cluster.ps: 1")
        if c.chief != 1:
            _fail("cluster.chief", c.chief, "parameter_server needs a chief to coordinate; set cluster.chief: 1")
        if c.workers < 1:
            _fail("cluster.workers", c.workers, "parameter_server needs at least one worker")
    elif c.ps:
        _fail("cluster.ps", c.ps, f"strategy '{s}' does not use parameter servers; set cluster.ps: 0")
    if c.evaluator and s not in MULTI_PROCESS_STRATEGIES:
        _fail(
            "cluster.evaluator",
            c.evaluator,
            f"a side-car evaluator only works with multi_worker_mirrored or parameter_server, not '{s}'; "
            "set cluster.evaluator: 0",
        )
    if s not in MULTI_PROCESS_STRATEGIES and c.chief + c.workers > 1:
        _fail(
            "cluster.workers",
            c.workers,
            f"strategy '{s}' runs in one process; use multi_worker_mirrored or parameter_server "
            "for several tasks, or set chief: 1, workers: 0",
        )
    if s in ("mirrored", "central_storage") and c.devices_per_worker < 1:
        _fail("cluster.devices_per_worker", c.devices_per_worker, f"'{s}' needs at least one device")
    if cfg.train.entrypoint and c.evaluator:
        _fail("cluster.evaluator", c.evaluator, "the side-car evaluator evaluates Pinpoint's own model; with "
              "train.entrypoint your code evaluates (e.g. fit's validation_data): set cluster.evaluator: 0")
    if s == "multi_worker_mirrored" and c.chief + c.workers + c.evaluator == 1:
        # The Training Operator sets no TF_CONFIG for a job of one replica, so a one-task
        # collective group would start without a cluster; refused the same way in both flavours.
        _fail("cluster.workers", c.workers, "multi_worker_mirrored with a single task has no peers (and the "
              "Training Operator gives a one-replica TFJob no TF_CONFIG); use strategy mirrored for one "
              "process, or add workers")


def _check_scheduling(cfg: Config) -> None:
    """Gang scheduling needs one object that holds every replica: a TFJob, JobSet or TrainJob."""
    c = cfg.cluster
    if c.gang == "kueue" and not c.queue:
        _fail("cluster.queue", None, "gang: kueue admits the job through a Kueue LocalQueue; set cluster.queue "
              "to its name")
    roles = [r for r, n in (("chief", c.chief), ("worker", c.workers), ("ps", c.ps), ("evaluator", c.evaluator)) if n]
    rules = FLAVOR_RULES[c.flavor]
    if c.gang != "off" and not rules.one_object and len(roles) > 1:
        _fail("cluster.gang", c.gang, f"the {c.flavor} flavour makes one Job per role ({', '.join(roles)}), which a "
              "scheduler admits one at a time; use flavor: jobset (or tfjob) for all-or-nothing scheduling")
    if c.gang not in rules.gangs:
        able = " or ".join(name for name, r in FLAVOR_RULES.items() if c.gang in r.gangs)
        _fail("cluster.gang", c.gang, f"schedulingPolicy is the Training Operator's, flavor {c.flavor} has none; use "
              f"flavor: {able} or gang: kueue")


def _check_pinning_vs_strategy(cfg: Config) -> None:
    p, s = cfg.train.pinning, cfg.train.strategy
    if cfg.train.jit_compile and s in ("central_storage", "parameter_server"):
        _fail(
            "train.jit_compile",
            True,
            f"'{s}' keeps variables off the replica devices, which XLA cannot compile into a step; "
            "set jit_compile: false (or leave it unset)",
        )
    # A user model's layer names are known once it is built (checked then, see usercode).
    valid = MODEL_LAYERS.get(cfg.train.model, ())
    for layer in p.layers:
        if layer.startswith(layer_keys.REGEX_PREFIX):
            try:
                layer_keys.check_key(layer)
            except ConfigError:
                _fail(layer_keys.field(layer), layer, "not a regular expression; fix the pattern after 're:'")
        if cfg.train.builtin_model and not any(layer_keys.key_matches(layer, name) for name in valid):
            _fail(
                layer_keys.field(layer),
                layer,
                f"model '{cfg.train.model}' has no such layer; valid names: {', '.join(valid)}",
            )
    if cfg.train.builtin_model and p.layers:
        layer_keys.resolve(p.layers, valid, cfg.train.model)  # a layer matched by two keys: ConfigError
    n = cfg.cluster.devices_per_worker
    why = {
        "mirrored": "mirrored keeps one copy of every variable on every replica device",
        "multi_worker_mirrored": "multi_worker_mirrored keeps one copy of every variable on every replica device",
        "central_storage": "central_storage keeps every variable on the host CPU",
        "parameter_server": "parameter_server shards variables across the ps tasks",
        "one_device": "one_device places everything on its single device",
    }
    if p.variables and s not in ("none",):
        _fail("train.pinning.variables", p.variables, f"{why[s]}; remove the rule or use strategy 'none'")
    if p.gradients and s not in ("none",):
        reason = why[s] if s in why else ""
        _fail(
            "train.pinning.gradients",
            p.gradients,
            f"{reason} and computes gradients where its replica runs; remove the rule or use strategy 'none'",
        )
    for field, device in pinned_devices(p):
        job, task, _, _ = parse_device(device)
        if job == "ps" and s != "parameter_server":
            _fail(field, device, f"a /job:ps device holds variables under strategy parameter_server only, "
                  f"not '{s}'; pin to a device of this task or use strategy parameter_server")
        if job == "ps" and (task or 0) >= cfg.cluster.ps:
            _fail(field, device, f"the cluster has {cfg.cluster.ps} ps task(s) (cluster.ps), so use "
                  f"/job:ps/task:0../job:ps/task:{max(cfg.cluster.ps - 1, 0)}")
    if s == "parameter_server":  # pinning.layers names the ps task holding each layer's variables
        for layer, device in p.layers.items():
            if parse_device(device)[0] != "ps":
                _fail(f"train.pinning.layers.{layer}", device, "parameter_server places a layer's variables "
                      "on a ps task and runs the layer on the worker; pin to '/job:ps/task:K/CPU:0'")
    if p.layers and s not in ("none", "parameter_server"):
        _fail(
            "train.pinning.layers",
            dict(p.layers),
            f"{why[s]}, so layers cannot be split across devices (model parallelism); "
            "remove the rule or use strategy 'none'",
        )
    # Device indices must exist in the requested topology (jobs other than localhost are checked
    # by the launcher, which knows the cluster).
    for field, device in pinned_devices(p):
        job, _, dtype, idx = parse_device(device)
        if job is not None:
            continue
        if dtype == "GPU" and cfg.cluster.device_type == "GPU" and idx >= max(n, 1):
            _fail(
                field,
                device,
                f"the spec has {n} GPU(s) per replica (cluster.devices_per_worker), so use /GPU:0../GPU:{max(n - 1, 0)}",
            )
        if dtype == "GPU" and cfg.cluster.device_type == "CPU":
            _fail(field, device, "cluster.device_type is CPU; pin to '/CPU:i' or set device_type: GPU")


def _check_data(cfg: Config) -> None:
    t = cfg.train
    src = file_source(t.data)
    if src and src[0] == "tfrecord":
        if not t.features:
            _fail("train.features", {}, "tfrecord data needs a feature spec, e.g. features: "
                  "{image: {shape: [8, 8, 1], dtype: float32}, label: {shape: [], dtype: int64}}")
        if t.label_column not in t.features:
            _fail("train.label_column", t.label_column,
                  f"it must name one of train.features ({', '.join(t.features)})")
        if len(t.features) < 2:
            _fail("train.features", list(t.features), "give the label and at least one input feature")
    elif t.features:
        _fail("train.features", list(t.features), "a feature spec is for tfrecord data only; remove it")
    if t.metrics and t.loss not in ("sparse_categorical_crossentropy", "categorical_crossentropy",
                                    "binary_crossentropy"):
        _fail("train.metrics", list(t.metrics), f"accuracy needs a classification loss, not '{t.loss}'; "
              "use metrics: [] (loss only) or a cross-entropy loss")


def _check_all_reduce(cfg: Config) -> None:
    """train.all_reduce combinations TensorFlow cannot run, refused before anything starts."""
    a, s, c = cfg.train.all_reduce, cfg.train.strategy, cfg.cluster
    if a == "auto":
        return
    if s not in ("mirrored", "multi_worker_mirrored"):
        _fail("train.all_reduce", a, f"strategy '{s}' does not all-reduce gradients across replicas; "
              "remove it (auto) or use strategy mirrored or multi_worker_mirrored")
    if s == "multi_worker_mirrored" and a in ("hierarchical_copy", "reduce_to_host"):
        _fail("train.all_reduce", a, "multi_worker_mirrored all-reduces with collectives only (TensorFlow's "
              "CommunicationOptions: ring or NCCL); use ring, auto or, on real GPUs, nccl")
    if a == "nccl" and (c.device_type == "CPU" or c.devices_per_worker == 0):
        _fail("train.all_reduce", a, "NCCL needs GPUs and the replicas are CPUs (cluster.device_type); "
              "use ring or auto")
    if a == "nccl" and c.emulate:
        _fail("train.all_reduce", a, "NCCL needs real GPUs; emulated GPUs are CPU devices: use ring (what NCCL's "
              "exchange is emulated with) or auto, or set cluster.emulate: false on a GPU machine")
    n = c.devices_per_worker
    if a == "hierarchical_copy" and n > 1 and n % 2:
        # TensorFlow sums two halves of n // 2 devices (DGX-1 topology): with an odd count the
        # last replica's gradients are silently left out (measured: 3 devices sum 1+2, not 1+2+3).
        _fail("train.all_reduce", a, f"hierarchical_copy reduces two equal halves of the devices and drops "
              f"the last one of {n}; use an even cluster.devices_per_worker, ring or reduce_to_host")


def pinned_devices(p: PinningConfig):
    """(config field, device) of every device string in train.pinning."""
    for field in ("variables", "gradients", "input"):
        value = getattr(p, field)
        if value:
            yield f"train.pinning.{field}", value
    for layer, device in p.layers.items():
        yield f"train.pinning.layers.{layer}", device
    for device in p.visible_devices or ():
        yield "train.pinning.visible_devices", device


def _one_line(err: ValidationError) -> str:
    e = err.errors()[0]
    if e["type"] == "pinpoint_field":  # a cross-field check (_fail)
        ctx = e["ctx"]
        return f"{ctx['field']}: got {ctx['value']}; {ctx['fix']}"
    loc = ".".join(str(p) for p in e["loc"] if p not in ("function-after",))
    msg = e["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    value = e.get("input")
    if e["type"] == "missing":
        return f"{loc}: got nothing (a required key); add it"
    if e["type"] == "extra_forbidden":
        return f"{loc}: got an unknown key (value {value!r}); remove it or check its spelling"
    shown = repr(value) if not isinstance(value, dict) else "a mapping"
    return f"{loc}: got {shown}; {msg}"


def config_from_dict(data: Any, source: str = "config") -> Config:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: got a {type(data).__name__} at the top level; write a mapping with 'name', "
                          "'cluster', 'train', 'tracking'")
    try:
        return Config.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_one_line(err)) from None


def load_config(path: str | Path) -> Config:
    """Read and validate a YAML config (safe loader); raise ConfigError with one line."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"CONFIG: got '{p}', which does not exist; pass a YAML file such as configs/demo.yaml")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"CONFIG: got '{p}', malformed YAML{where}; fix the syntax") from None
    return resolve_paths(config_from_dict(data, str(p)), p.resolve().parent)


def resolve_paths(cfg: Config, base: Path) -> Config:
    """Make train.code_dir (default for user code: `base`, the config file's folder) and a
    streamed file source's path absolute, so every task, step and pod reads the same files."""
    t = cfg.train
    user_code = bool(t.entrypoint) or any(is_import_path(v) for v in (t.model, t.data, t.loss))
    # Only a config that names user code gets a default code_dir (a built-in run's digest,
    # the key of its cached steps, stays the same wherever the file lives).
    code_dir = str((base / t.code_dir).resolve()) if t.code_dir else (str(base) if user_code else None)
    data = t.data
    src = file_source(data)
    if src and not Path(src[1]).is_absolute():
        data = f"{src[0]}:{base / src[1]}"
    # Only what changed is updated: an updated field counts as written (config_scope).
    update = {k: v for k, v in (("code_dir", code_dir), ("data", data)) if v != getattr(t, k)}
    if not update:
        return cfg
    return cfg.model_copy(update={"train": t.model_copy(update=update)})


def config_to_yaml(cfg: Config) -> str:
    """The fields the user wrote (and the paths load_config resolved): reloaded, the same Config,
    whose fields the path ignores are still told apart from defaults (config_scope)."""
    return yaml.safe_dump(cfg.model_dump(mode="json", exclude_unset=True), sort_keys=False)
