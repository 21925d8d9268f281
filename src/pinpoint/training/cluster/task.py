"""One task of a local (or Kubernetes) cluster: `pinpoint train CONFIG --out DIR --task worker:1`.

TF_CONFIG (set by the launcher or the TFJob operator) says who this process is. Under
multi_worker_mirrored the chief and workers all train (collectives need every one of them);
under parameter_server the chief coordinates, workers and ps run a tf.distribute.Server and wait.
The evaluator runs side-car evaluation of the checkpoints the chief writes.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from pinpoint.config import Config
from pinpoint.device_names import DeviceMap
from pinpoint.devices import setup_devices
from pinpoint.errors import RETRY_EXIT_CODE, ConfigError, PeerLost
from pinpoint.runfolder import CHECKPOINTS, METRICS
from pinpoint.training.peers import first_line, peer_lost

EVAL_LOG = "eval_log.jsonl"


def run_task(
    cfg: Config,
    out_dir: Path,
    role: str,
    index: int,
    *,
    resume_from_run: str | None = None,
    parent_run_id: str | None = None,
) -> int:
    """Run task role:index of the cluster described by TF_CONFIG; return the exit code."""
    out = Path(out_dir)
    tf_config = os.environ.get("TF_CONFIG")
    if not tf_config:
        raise ConfigError(
            "--task: TF_CONFIG is not set; run `pinpoint train CONFIG` without --task "
            "(the local launcher sets TF_CONFIG for each task)"
        )
    parsed = json.loads(tf_config)
    task = parsed.get("task", {})
    if (task.get("type"), int(task.get("index", -1))) != (role, index):
        raise ConfigError(f"--task: got {role}:{index} but TF_CONFIG says {task}; make them agree")
    if "evaluator" in parsed.get("cluster", {}):
        # The Training Operator lists the evaluator in every task's cluster dict, but it runs no
        # server: a strategy that tried to connect to it would hang. TF expects it left out.
        from pinpoint.provision.tfconfig import training_tf_config

        os.environ["TF_CONFIG"] = json.dumps(training_tf_config(parsed))
    chief = role == "chief" or (role == "worker" and index == 0 and "chief" not in parsed.get("cluster", {}))
    if cfg.tracking.enabled and chief and role != "evaluator":
        from pinpoint.tracking import warm_tracking

        warm_tracking(cfg, "train")  # the task that tracks: MLflow's sender starts while TensorFlow does
    dm = setup_devices(cfg)  # before TensorFlow initializes anything
    if role == "evaluator":
        return run_evaluator(cfg, out, dm)
    try:
        if cfg.train.strategy == "parameter_server" and role in ("worker", "ps"):
            return _serve(role, index, out if cfg.placement.memory else None)
        return _train_task(cfg, out, dm, role, index, resume_from_run, parent_run_id)
    except Exception as err:
        if peer_lost(err):
            # Exit with the retry code, not 1: on Kubernetes an exit code below 128 fails the
            # whole job for good, while the group could restart from its last checkpoint.
            raise PeerLost(
                f"{role}:{index} lost a peer of the cluster ({type(err).__name__}: {first_line(err)}); "
                f"exiting with {RETRY_EXIT_CODE} so the group restarts from the latest checkpoint"
            ) from None
        raise


def _serve(role: str, index: int, memory_out: Path | None = None) -> int:
    """A ps or worker task of parameter_server: serve variables / run closures until stopped
    (`memory_out`: placement.memory, its allocator's figures written there: placement.capture.tasks)."""
    import tensorflow as tf

    from pinpoint.training.setup import resolver

    r = resolver()
    server = tf.distribute.Server(r.cluster_spec(), job_name=role, task_index=index,
                                  protocol=r.rpc_layer or "grpc", start=True)
    print(f"pinpoint: {role}:{index} serving at {server.target}", flush=True)
    if memory_out is not None:
        from pinpoint.placement import start_reporting

        start_reporting(memory_out, role, index)
    server.join()  # returns only when the process is stopped
    return 0


def _train_task(cfg, out, dm, role, index, resume_from_run, parent_run_id) -> int:
    """parameter_server's chief (the coordinator) or a multi_worker_mirrored task."""
    from pinpoint.training.run import run_training
    from pinpoint.training.setup import task_context

    ctx = task_context(cfg, dm, role, index, cluster=True)
    return run_training(cfg, out, ctx, resume_from_run=resume_from_run, parent_run_id=parent_run_id)


def run_evaluator(cfg: Config, out: Path, dm: DeviceMap, *, poll: float = 2.0) -> int:
    """Side-car evaluation: evaluate each new checkpoint the chief writes, until training ends.

    Appends {"step", "loss", "accuracy"} to OUT/eval_log.jsonl. Stops once the final step is
    evaluated or the chief has written metrics.json (the launcher also stops it).
    """
    import tensorflow as tf

    from pinpoint.training.checkpoints import candidates, verify
    from pinpoint.training.loop.engine import build_state, evaluate
    from pinpoint.training.setup import task_context

    # The model as every training task builds it (seed, precision, pinning), outside any cluster.
    state = build_state(cfg, task_context(cfg, dm, "evaluator", 0))
    model, data, objective = state.model, state.data, state.objective
    ckpt = tf.train.Checkpoint(model=model, step=state.step_var)
    started = time.time()
    done: set[int] = set()
    log = out / EVAL_LOG
    while True:
        found = candidates(out / CHECKPOINTS)
        for step, prefix in found[:1]:  # the newest only: keep up with the chief
            if step in done:
                continue
            try:
                verify(prefix)
                ckpt.restore(prefix).expect_partial()
            except Exception as err:  # noqa: BLE001 - being written or already rotated away
                print(f"eval: {Path(prefix).name} not readable yet ({type(err).__name__}); retrying", flush=True)
                continue
            m = evaluate(model, data, objective)
            with log.open("a") as f:
                f.write(json.dumps({"step": step, **m, "time": time.time()}) + "\n")
            acc = f" acc={m['accuracy']:.3f}" if m["accuracy"] is not None else ""
            print(f"eval step {step}: loss={m['loss']:.4f}{acc}", flush=True)
            done.add(step)
        metrics = out / METRICS
        if (done and max(done) >= cfg.train.steps) or (metrics.is_file() and metrics.stat().st_mtime >= started):
            return 0
        time.sleep(poll)

