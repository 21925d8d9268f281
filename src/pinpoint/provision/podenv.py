"""Pod entry point of the plain and JobSet flavours: build TF_CONFIG from the pod's index, then exec.

`python -m pinpoint.provision.podenv CMD...` reads PINPOINT_TF_CLUSTER (the cluster dict as
JSON), PINPOINT_TASK_ROLE and PINPOINT_TASK_INDEX (the Indexed Job's completion index), sets
TF_CONFIG to exactly what the Training Operator would have set for that replica, and replaces
itself with CMD. Nothing else: no TensorFlow import, so the task starts as fast as under a TFJob.

A TrainJob's pods share one Job (flavour trainjob): PINPOINT_TASK_LAYOUT ('chief:1,worker:2')
maps the completion index to the role and the index within it, and an argument '{task}' of CMD
becomes 'ROLE:INDEX'.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Mapping

from pinpoint.provision.tfconfig import tf_config, to_json

# The one Secret of MLflow connection settings, read by the pipeline's steps (kfp secretAsEnv)
# and by the training pods (secretKeyRef): Secret data key -> environment variable the MLflow
# client reads. Every key is optional (a cluster without the Secret uses tracking.uri).
MLFLOW_SECRET_KEYS = {
    "tracking-uri": "MLFLOW_TRACKING_URI",
    "username": "MLFLOW_TRACKING_USERNAME",
    "password": "MLFLOW_TRACKING_PASSWORD",
}
# train.collective_timeout_s as the tasks read it (set by the local launcher and the manifests).
COLLECTIVE_TIMEOUT_ENV = "PINPOINT_COLLECTIVE_TIMEOUT"


def collective_timeout_env(cfg) -> dict[str, str]:
    """The tasks' environment for train.collective_timeout_s: nothing when it is off."""
    t = cfg.train.collective_timeout_s
    return {COLLECTIVE_TIMEOUT_ENV: str(t)} if t else {}


def allocator_env(cfg) -> dict[str, str]:
    """placement.memory: the tasks start with the host allocator that traces every allocation
    (read once, when TensorFlow starts) and the GPU size its verdict is made for
    (cluster.gpu_memory); nothing when it is off."""
    from pinpoint.placement import ALLOCATOR_ENV, GPU_MEMORY_ENV
    from pinpoint.sizes import parse_size

    if not cfg.placement.memory:
        return {}
    size = cfg.cluster.gpu_memory
    return {ALLOCATOR_ENV: "true", **({GPU_MEMORY_ENV: str(parse_size(size, "cluster.gpu_memory"))} if size else {})}


def uri_has_credentials(uri: str | None) -> bool:
    """True if a URI carries a user (and password) before its host: 'http://alice:pw@host'."""
    if not uri:
        return False
    return "@" in uri.split("//", 1)[-1].split("/", 1)[0]


TASK_LAYOUT_ENV = "PINPOINT_TASK_LAYOUT"


def task_of_index(layout: str, index: int) -> tuple[str, int]:
    """('worker', 1) for index 2 of 'chief:1,worker:2'; ValueError outside the layout."""
    offset = 0
    for part in filter(None, layout.split(",")):
        role, _, n = part.partition(":")
        if index < offset + int(n):
            return role, index - offset
        offset += int(n)
    raise ValueError(f"PINPOINT_TASK_INDEX={index} is outside the {offset} tasks of {TASK_LAYOUT_ENV}={layout!r}")


def task_from_env(env: Mapping[str, str]) -> tuple[str, int]:
    """(role, index) of this pod: PINPOINT_TASK_ROLE, or the TrainJob layout's role of the index."""
    index = int(env["PINPOINT_TASK_INDEX"])
    if env.get(TASK_LAYOUT_ENV):
        return task_of_index(env[TASK_LAYOUT_ENV], index)
    return env["PINPOINT_TASK_ROLE"], index


def tf_config_from_env(env: Mapping[str, str]) -> str:
    """The TF_CONFIG JSON for the pod described by `env`; ValueError naming the bad variable."""
    try:
        cluster = json.loads(env["PINPOINT_TF_CLUSTER"])
        role, index = task_from_env(env)
    except KeyError as err:
        raise ValueError(f"environment variable {err.args[0]} is not set; the manifest must define it") from None
    except ValueError as err:
        raise ValueError(f"PINPOINT_TF_CLUSTER/PINPOINT_TASK_INDEX malformed ({err})") from None
    if role != "evaluator" and not 0 <= index < len(cluster.get(role, [])):
        raise ValueError(f"PINPOINT_TASK_INDEX={index} is outside the {len(cluster.get(role, []))} '{role}' tasks")
    return to_json(tf_config(cluster, role, index))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    try:
        value = tf_config_from_env(os.environ)
    except ValueError as err:
        print(f"pinpoint podenv: {err}", file=sys.stderr)
        return 2
    os.environ["TF_CONFIG"] = value
    if not argv:  # no command: print it (used to inspect a pod's TF_CONFIG)
        print(value)
        return 0
    task = json.loads(value)["task"]
    argv = [f"{task['type']}:{task['index']}" if a == "{task}" else a for a in argv]
    os.execvp(argv[0], argv)
    return 127  # pragma: no cover - execvp does not return


if __name__ == "__main__":
    sys.exit(main())
