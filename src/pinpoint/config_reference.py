"""docs/config.md, the reference of every config field, generated from the schema: each field's
type and default from pinpoint.config, what it does from DESCRIPTIONS below, and the paths where it
has no effect (and is refused) from pinpoint.config_scope. `make config-docs` writes it;
tests/test_config_reference.py checks the file against the schema.

    python -m pinpoint.config_reference docs/config.md
"""

from __future__ import annotations

import sys
import typing
from pathlib import Path

from pydantic import BaseModel

from pinpoint import config_scope
from pinpoint.config import Config

SECTIONS = ("cluster", "train", "pinning", "tracking", "placement")  # the nested sections, walked
# What each field does, one or two sentences; a test keeps the keys equal to the schema's fields.
DESCRIPTIONS = {
    "name": "The run's name: a DNS-1123 name of at most 40 characters starting with a letter; the run folder "
            "is `runs/<name>/` and it names the Kubernetes objects.",
    "cluster.chief": "Chief tasks (at most 1).",
    "cluster.workers": "Worker tasks (multi_worker_mirrored, parameter_server).",
    "cluster.ps": "Parameter-server tasks (parameter_server only).",
    "cluster.evaluator": "A side-car evaluator task (multi_worker_mirrored, parameter_server; not with "
                         "train.entrypoint): it evaluates every checkpoint.",
    "cluster.devices_per_worker": "Devices each replica task trains on (0: the host CPU only).",
    "cluster.device_type": "`GPU` or `CPU`: what `/GPU:i` or `/CPU:i` in the spec means.",
    "cluster.emulate": "GPUs emulated as logical CPU devices (`/GPU:i` runs on `/CPU:i+1`); false on a GPU machine.",
    "cluster.gpu_resource": "The Kubernetes extended resource a GPU is requested as.",
    "cluster.gpu_type": "A GPU model the pods are scheduled to (node label `gpu_type_label`).",
    "cluster.gpu_memory": "Each GPU's memory (`16GiB`, `80GB`): with placement.memory, a fits verdict per "
                          "device (docs/memory.md).",
    "cluster.gpu_type_label": "The node label that names a node's GPU model.",
    "cluster.cpu": "CPU request of each training pod (a Kubernetes quantity: `2`, `500m`).",
    "cluster.memory": "Memory request of each training pod (`4Gi`).",
    "cluster.shm_size": "Size of each pod's /dev/shm (`1Gi`).",
    "cluster.tolerations": "Tolerations of the training pods (`key`, `operator`, `value`, `effect`).",
    "cluster.node_selector": "Node labels the training pods must match.",
    "cluster.image": "The training pods' image (a user image for train.model/data/loss/entrypoint code: "
                     "`make images CODE_DIR=...`).",
    "cluster.image_pull_secrets": "dockerconfigjson Secrets the pods pull the image with.",
    "cluster.namespace": "Kubernetes namespace (unset: the step pod's namespace, or `default` outside a cluster).",
    "cluster.port": "The TensorFlow servers' port inside each pod (not an Istio port).",
    "cluster.cluster_domain": "The cluster's DNS domain in the tasks' addresses (`cluster.local`).",
    "cluster.flavor": "What the manifests hold: `tfjob`, `plain` (Indexed Jobs), `jobset` or `trainjob` "
                      "(docs/kubernetes.md).",
    "cluster.runs_volume_claim": "ReadWriteMany claim holding the run folders (required for multi-process runs "
                                 "on Kubernetes).",
    "cluster.unschedulable_grace_s": "Seconds a pod may stay unschedulable before the launch step gives up (a GPU "
                                     "node pool scaling up from zero takes minutes).",
    "cluster.deadline_s": "activeDeadlineSeconds of the workload and the launch step's own timeout.",
    "cluster.ttl_after_finished_s": "Finished workloads (and their pods' logs) are removed after this many seconds.",
    "cluster.mlflow_secret": "Secret with the MLflow connection (keys tracking-uri, username, password) given to "
                             "the pods; null: none.",
    "cluster.gang": "All-or-nothing scheduling: `off`, `kueue` (cluster.queue) or `operator` (tfjob only).",
    "cluster.queue": "The Kueue LocalQueue (gang: kueue) or the gang scheduler's queue.",
    "train.strategy": "The tf.distribute strategy: `none`, `one_device`, `mirrored`, `multi_worker_mirrored`, "
                      "`central_storage`, `parameter_server`.",
    "train.pinning.variables": "Device of every variable (strategy none).",
    "train.pinning.gradients": "Device the gradients are computed on (strategy none).",
    "train.pinning.layers": "Layer name, path, glob or `re:` pattern -> device (model parallelism, strategy none; "
                            "ps task under parameter_server).",
    "train.pinning.layers_backward": "With layers pinned: `follow` runs each layer's backward ops on its device, "
                                     "`default` where the gradient call's scope puts them.",
    "train.pinning.input": "Device of the input pipeline.",
    "train.pinning.soft_placement": "TensorFlow's soft device placement (an op without a kernel on its device "
                                    "moves).",
    "train.pinning.visible_devices": "The devices TensorFlow may see in each task.",
    "train.entrypoint": "Your own training code, `package.module:function`, called as `function(ctx)` "
                        "(docs/trace.md); the fields of Pinpoint's loop are then refused (last column).",
    "train.entrypoint_args": "Given to train.entrypoint's function as `ctx.args`, as written (a mapping or a list).",
    "train.model": "A built-in model (`mlp`, `cnn`, `transformer`) or `package.module:callable` returning a "
                   "keras.Model (docs/user-code.md).",
    "train.model_args": "Keyword arguments of your train.model callable.",
    "train.code_dir": "Folder put first on sys.path in every task (default: the config's folder when it names "
                      "user code).",
    "train.data": "`digits`, `synthetic`, a .npz/.csv file, `tfrecord:GLOB`, `csv:GLOB`, `parquet:GLOB`, "
                  "`images:DIR` or a `package.module:callable` returning a tf.data.Dataset.",
    "train.data_args": "Keyword arguments of your train.data callable.",
    "train.features": "The TFRecord feature spec (`shape`, `dtype`), tfrecord data only.",
    "train.label_column": "The label's column or feature.",
    "train.num_classes": "Classes of the label, where the data cannot tell (TFRecords).",
    "train.shuffle_buffer": "Shuffle buffer of streamed data.",
    "train.loss": "A Keras loss name or `package.module:callable`.",
    "train.from_logits": "The model outputs logits (the loss applies the softmax/sigmoid).",
    "train.metrics": "`[accuracy]` or `[]`; unset: accuracy where the loss allows it.",
    "train.precision": "`float32`, `mixed_float16` or `mixed_bfloat16` (Keras' dtype policy).",
    "train.synthetic_examples": "Examples of the `synthetic` data set.",
    "train.batch_size": "Global batch size (split across the replicas).",
    "train.learning_rate": "The optimizer's learning rate.",
    "train.optimizer": "`sgd` or `adam`.",
    "train.steps": "Training steps.",
    "train.checkpoint_every": "Steps between checkpoints (0: none).",
    "train.keep_checkpoints": "Checkpoints kept in the run folder.",
    "train.max_restarts": "Restarts of a failed task (locally and on Kubernetes).",
    "train.collective_timeout_s": "multi_worker_mirrored: abort an all-reduce waiting longer than this for a "
                                  "hung peer (off by default).",
    "train.seed": "Seed of the model's initial weights and the data order.",
    "train.log_every": "Steps between two logged steps (train_log.jsonl; Pinpoint's loop runs this many steps "
                       "per call; Keras fit's batch logs with train.entrypoint). Which of them reach MLflow: "
                       "tracking.step_metrics_every_s.",
    "train.jit_compile": "XLA for each replica's step; unset: on for a built-in model without per-op pinning.",
    "train.all_reduce": "How gradients are all-reduced: `auto`, `nccl`, `hierarchical_copy`, `reduce_to_host`, "
                        "`ring` (mirrored, multi_worker_mirrored; docs/placement.md).",
    "tracking.enabled": "Log the run to MLflow.",
    "tracking.uri": "The MLflow tracking URI (unset: the local store mlruns/; `MLFLOW_TRACKING_URI` also works).",
    "tracking.experiment": "The MLflow experiment.",
    "tracking.step_metrics_budget": "The first this many sends of step metrics go out as logged, so a short "
                                    "run draws a curve (the demo's 300 steps: 31 points); after them "
                                    "step_metrics_every_s applies (0: by time from the first step).",
    "tracking.step_metrics_every_s": "The one cadence of step metrics in MLflow once step_metrics_budget is "
                                     "spent: each metric at most once per this many seconds, its latest value "
                                     "always (0: every logged step). The journal is sent once a second, batched "
                                     "(docs/tracking.md).",
    "tracking.checkpoints_every_s": "Checkpoints reach MLflow at most once per this many seconds, the last one "
                                    "always (0: every one).",
    "tracking.log_model": "Log the final model (MLflow keras flavor).",
    "placement.enabled": "Capture where ops, variables and transfers ran (placement.json).",
    "placement.warmup_steps": "Steps run before the sampled ones.",
    "placement.sample_steps": "Steps whose graphs and placement are captured.",
    "placement.timing": "Time per device over the sampled steps (TensorFlow's profiler).",
    "placement.memory": "Memory per device over the sampled steps (docs/memory.md).",
}


def fields(model: type[BaseModel] = Config, prefix: str = "") -> list[tuple[str, typing.Any]]:
    """(dotted field, pydantic FieldInfo) of every field of the schema, sections walked."""
    out = []
    for name, info in model.model_fields.items():
        kind = info.annotation
        if name in SECTIONS and isinstance(kind, type) and issubclass(kind, BaseModel):
            out += fields(kind, f"{prefix}{name}.")
        else:
            out.append((prefix + name, info))
    return out


def _type(kind: typing.Any) -> str:
    text = str(kind).replace("typing.", "").replace("pinpoint.config.", "")
    return text.replace("<class '", "").replace("'>", "")


def _default(info: typing.Any) -> str:
    if info.is_required():
        return "required"
    value = info.get_default(call_default_factory=True)
    return "unset" if value is None else f"`{value!r}`".replace("|", "\\|")


def _no_effect(field: str) -> str:
    cells = [f"{', '.join(config_scope.CHOSEN_BY[p] for p in config_scope.PATHS if p in r.paths)}: {r.why}"
             for r in config_scope.rules(field)]
    need = config_scope.NEEDS.get(field)
    return "; ".join(cells + ([need.condition] if need else []))


def render() -> str:
    lines = ["# Config reference", "", "## In short",
             "- One YAML file: `name`, then the sections `cluster`, `train`, `tracking` and `placement`.",
             "- Every field is below, with its type, its default and what it does.",
             "- A field that has no effect on your path is refused in one line, with the fix.",
             "- A default you did not write is never refused.",
             "- `make config-docs` writes this page from the schema; a test holds it to the schema.", "",
             "<!-- generated by `make config-docs` (python -m pinpoint.config_reference docs/config.md) from "
             "src/pinpoint/config.py; do not edit -->", "", "## Fields", "",
             "Every field of the YAML config, its default and what it does. A field has no effect on some "
             "paths (your own code with `train.entrypoint`, or a built-in model): written there, it is "
             "refused in one line saying why and what to do; so is a field written without what it needs "
             "(`unless ...`, `without ...`). A default you did not write is never refused.",
             "", "| field | type | default | what it does | no effect (refused) with |", "|---|---|---|---|---|"]
    for field, info in fields():
        text = DESCRIPTIONS[field].replace("|", "\\|")
        kind = _type(info.annotation).replace("|", "\\|")
        lines.append(f"| `{field}` | {kind} | {_default(info)} | {text} | {_no_effect(field)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m pinpoint.config_reference docs/config.md", file=sys.stderr)
        return 2
    Path(argv[0]).write_text(render())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
