"""`pinpoint trace` on programs written as users write them, run for real as `pinpoint` processes:
the worked examples (a GradientTape loop split over two GPUs, a `model.fit` script under
MirroredStrategy()), an eager assign, a tf.compat.v1 Session program, and every way a program ends.
Figures are derived from the models' sizes, not copied from a run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from tests import zygote
from tests.first_screen import ARROW, BOX_FILL, chromium, expected_from_placement, read_first_screen, shows

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
F32 = 4


def trace(args: list[str], *, cwd: Path, out: Path, tracking: bool = False, env: dict | None = None,
          expect: int = 0) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "pinpoint.cli", "trace", "--out", str(out)]
    if not tracking:
        argv.append("--no-tracking")
    full_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})}
    # Forked from a process with TensorFlow and Pinpoint imported: no start-up.
    proc = zygote.python([*argv, *args], cwd=cwd, env=full_env, timeout=540, preload=zygote.PINPOINT)
    assert proc.returncode == expect, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def placement(out: Path, *, sized: bool = True) -> dict:
    """placement.json of a traced program; with `sized`, every transfer it made has its bytes
    (issue 35: a test program whose transfer goes unsized fails wherever it is traced)."""
    from pinpoint.placement.model.files import read_placement

    p = read_placement(out)
    # Issue 48: TensorFlow's shape inference failing (or contradicting the traced graph) is an error
    # wherever a program is traced, sized or not.
    assert (p.get("transfers") or {}).get("sizing_errors", []) == []
    if sized and p.get("transfers"):
        assert (p["transfers"]["per_step"]["unsized"], p["transfers"].get("unsized_reasons", {})) == (0, {})
    return p


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


# ---- the custom loop: model parallelism by hand, gradients pinned ----------------------------------
BATCH, INPUTS, HIDDEN, CLASSES = 32, 64, 128, 10


@pytest.fixture(scope="module")
def custom_loop(tmp_path_factory) -> tuple[dict, dict, str, Path]:
    out = tmp_path_factory.mktemp("trace") / "loop"
    proc = trace(["--gpus", "2", "-m", "loop_example.train", "--steps", "30", "--batch-size", str(BATCH)],
                 cwd=EXAMPLES / "custom_loop", out=out)
    return placement(out), json.loads((out / "metrics.json").read_text()), proc.stdout, out


def test_custom_loop_layers_run_where_their_tf_device_scopes_put_them(custom_loop):
    p, _, _, _ = custom_loop
    train = p["functions"][0]
    assert (train["name"], train["training"], train["calls"]) == ("train_step", True, 30)
    forward = [o for o in p["ops"] if not o["op"].startswith("gradient_tape/")]
    dense_1 = {o["device"] for o in forward if o["op"].startswith("dense_1")}
    head = {o["device"] for o in forward if o["op"].startswith("head")}
    assert (dense_1, head) == ({"/GPU:0"}, {"/GPU:1"})
    devices = {v["name"]: v["devices"] for v in p["variables"]}
    assert devices["dense_1/kernel"] == devices["dense_1/bias"] == ["/GPU:0"]
    assert devices["head/kernel"] == devices["head/bias"] == ["/GPU:1"]
    # Each variable's update runs on the variable's own device.
    updates = {v["name"]: v["update_devices"] for v in p["variables"]}
    assert updates["head/kernel"] == ["/GPU:1"] and updates["dense_1/kernel"] == ["/GPU:0"]


def test_custom_loop_gradients_run_under_the_pinned_device(custom_loop):
    p, _, _, _ = custom_loop
    assert list(p["gradients"]["ops_by_device"]) == ["/GPU:0"]
    assert p["gradients"]["total"] > 0
    rules = {r["rule"]: r for r in p["conformance"]["rules"]}
    assert rules["tf.device /GPU:0"]["score"] == 1.0 and rules["tf.device /GPU:1"]["score"] == 1.0


def test_custom_loop_activation_bytes_cross_each_way(custom_loop):
    p, _, _, _ = custom_loop
    matrix = p["transfers"]["matrix"]
    # GPU:0 -> GPU:1: dense_1's activations, then head's gradients (computed on GPU:0) to its update.
    assert matrix["/GPU:0"]["/GPU:1"]["bytes"] == BATCH * HIDDEN * F32 + (HIDDEN * CLASSES + CLASSES) * F32
    # GPU:1 -> GPU:0: the logits (the loss has no device request: the default GPU:0), and head's
    # kernel, which the backward pass pinned to GPU:0 reads.
    assert matrix["/GPU:1"]["/GPU:0"]["bytes"] == BATCH * CLASSES * F32 + HIDDEN * CLASSES * F32
    relu = [i for i in p["transfers"]["largest"] if i["tensor"].startswith("dense_1") and i["from"] == "/GPU:0"]
    assert [(i["to"], i["bytes"]) for i in relu] == [("/GPU:1", BATCH * HIDDEN * F32)]



@pytest.mark.skipif(chromium() is None, reason="headless Chromium not installed (Debian package 'chromium')")
def test_custom_loop_report_opens_on_the_run_with_its_activations_crossing(custom_loop):
    """Issue 51: a model split over two GPUs; the first screen (a screenshot in test-output/) draws
    each device with its ops and variables and an arrow per pair with its bytes, and says there is
    nothing to change (no round trip, fallback, off-plan op or eager copy in placement.json)."""
    p, _, _, out = custom_loop
    screen = read_first_screen(out / "report.html", "split-two-gpus")
    boxes, arrows, reduced = expected_from_placement(p)
    assert (screen.boxes, screen.arrows, screen.reduced) == (boxes, arrows, None)
    assert screen.arrows[("/GPU:0", "/GPU:1")] == BATCH * HIDDEN * F32 + (HIDDEN * CLASSES + CLASSES) * F32
    assert screen.arrows[("/GPU:1", "/GPU:0")] == BATCH * CLASSES * F32 + HIDDEN * CLASSES * F32
    assert screen.boxes["/GPU:1"][1] == 2  # head's kernel and bias
    quiet = not (p["transfers"].get("round_trips") or p["fallbacks"] or (p.get("eager") or {}).get("copies")
                 or (p.get("eager") or {}).get("not_where_requested")
                 or any(r["score"] is not None and r["score"] < 1 for r in p["conformance"]["rules"]))
    assert quiet and (screen.nothing, screen.findings) == (True, [])
    assert shows(screen.screenshot, BOX_FILL) and shows(screen.screenshot, ARROW)

def test_custom_loop_pinpoint_log_reaches_metrics_and_the_program_is_unchanged(custom_loop):
    _, metrics, stdout, _ = custom_loop
    assert metrics["exit_code"] == 0 and metrics["steps"] == 30
    assert metrics["final_loss"] > 0
    assert "step 30/30: loss" in stdout  # the program's own output
    assert "functions  : 1: train_step x30 (training)" in stdout  # then the summary


def test_custom_loop_plans_its_layers_with_the_gradients_where_the_program_put_them(custom_loop, capsys):
    """The traced program's ops belong to its Keras layers; its whole backward pass ran on /GPU:0
    (the program's tf.device around tape.gradient), apart from head, so every layer's backward
    pass is a group of its own there (dense_1's too, though it ran beside dense_1): moving a layer
    does not move them, the plan moves them together. The plan's prediction of the run as it ran
    is its measured bytes, and the plan is a tf.device mapping of the program's layers and of its
    gradient call."""
    from pinpoint.cli import main
    from pinpoint.plan.build import plan_graph
    from pinpoint.plan.predict import bytes_crossing

    p, _, _, out = custom_loop
    assert {o["layer"] for o in p["ops"] if o["op"].startswith(("dense_1", "head"))} == {"dense_1", "head"}
    g = plan_graph(out)
    groups = {x.key: (x.device, x.movable) for x in g.groups}
    assert g.gradient_device == "/GPU:0"
    assert (groups["dense_1"], groups["head"], groups["head (backward)"], groups["dense_1 (backward)"]) == (
        ("/GPU:0", True), ("/GPU:1", True), ("/GPU:0", False), ("/GPU:0", False))
    ran = {x.key: x.device for x in g.groups}
    measured = {(a, b): cell["bytes"] for a, row in p["transfers"]["matrix"].items() for b, cell in row.items()
                if cell["bytes"]}
    assert bytes_crossing(g, ran) == measured
    assert main(["plan", str(out), "--out", str(out / "plan.yaml")]) == 0
    import yaml

    plan = yaml.safe_load((out / "plan.yaml").read_text())
    assert set(plan["pinning"]["layers"]) == {"dense_1", "head"}
    assert plan["tf_device"] == {**plan["pinning"]["layers"], "gradients": plan["pinning"]["gradients"]}
    assert set(plan["tf_device"].values()) <= {"/GPU:0", "/GPU:1"}


# ---- model.fit under MirroredStrategy() on 2 emulated GPUs, logged to a real MLflow server ----------
def test_fit_under_mirrored_strategy_mirrors_every_variable_and_logs_keras_loss(tmp_path, live_mlflow):
    from mlflow.tracking import MlflowClient

    out = tmp_path / "fit"
    proc = trace(["--gpus", "2", "--experiment", "trace-fit", "--log-every", "10", "--metrics-every-s", "0",
                  "-m", "fit_example.train",
                  "--epochs", "2", "--steps-per-epoch", "20"],
                 cwd=EXAMPLES / "keras_fit", out=out, tracking=True, env={"MLFLOW_TRACKING_URI": live_mlflow.uri})
    assert "training on 2 replica(s)" in proc.stdout  # MirroredStrategy() found the 2 emulated GPUs
    p = placement(out)
    assert p["strategy"] == "mirrored" and p["training_function"] == "multi_step_on_iterator"
    weights = [v for v in p["variables"] if v["name"].startswith("digits_mlp/")]
    assert sorted(v["name"] for v in weights) == ["digits_mlp/hidden/bias", "digits_mlp/hidden/kernel",
                                                  "digits_mlp/logits/bias", "digits_mlp/logits/kernel"]
    for v in weights:
        assert [c["device"] for c in v["components"]] == ["/GPU:0", "/GPU:1"], v
    # One all-reduce of every gradient per replica device: the collective among the emulated GPUs.
    params = 64 * 128 + 128 + 128 * 10 + 10
    coll = p["transfers"]["collectives"]
    assert sorted(coll) == ["/GPU:0", "/GPU:1"]
    assert all(c["input_bytes"] == params * F32 for c in coll.values()), coll
    assert p["replica_consistency"]["variables"]["digits_mlp/hidden/kernel"] == 0.0

    client = MlflowClient(live_mlflow.uri)
    exp = client.get_experiment_by_name("trace-fit")
    (run,) = client.search_runs([exp.experiment_id], filter_string="tags.`pinpoint.step` = 'trace'")
    assert run.info.status == "FINISHED"
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "loss")) == [10, 20, 30, 40]
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "epoch_loss")) == [20, 40]
    assert run.data.params["fit.strategy"] == "MirroredStrategy"
    assert run.data.params["fit.num_replicas"] == "2"
    assert run.data.params["fit.optimizer"] == "SGD"
    assert run.data.params["fit.batch_size"] == "64"
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"placement.json", "report.html"} <= artifacts
    if chromium() is not None:  # issue 51: the first screen of a traced fit
        _fit_first_screen(p, out, params)


def _fit_first_screen(p: dict, out: Path, params: int) -> None:
    """The traced fit's report opens on its findings (each round trip of placement.json, both ways'
    bytes, the costliest first) and on the run: two replicas all-reducing every gradient."""
    from pinpoint.placement.report.summary import human_bytes

    screen = read_first_screen(out / "report.html", "traced-keras-fit")
    boxes, arrows, reduced = expected_from_placement(p)
    assert (screen.boxes, screen.arrows) == (boxes, arrows)
    assert screen.reduced == reduced == 2 * params * F32  # each replica's gradients, once a step
    trips = sorted(p["transfers"].get("round_trips") or [], key=lambda r: -r["bytes"])
    shown = [e for k, e in screen.findings if k == "round trip"]
    assert [f"{human_bytes(2 * r['bytes'])} per step" in e for r, e in zip(trips, shown, strict=True)] == \
        [True] * len(trips)
    if trips:
        assert screen.findings[0][0] == "round trip"  # bytes per step rank first
    assert screen.nothing == (screen.findings == [])
    assert shows(screen.screenshot, BOX_FILL)


# ---- eager ops: an assign of a tensor made on the CPU to a variable on a GPU ------------------------
def test_eager_assign_runs_on_the_variables_device_after_a_copy(tmp_path):
    script = write(tmp_path, "assign.py", """
        import tensorflow as tf
        with tf.device("/GPU:1"):
            v = tf.Variable(tf.zeros([300]))
        with tf.device("/CPU:0"):
            x = tf.ones([300])
        v.assign(x)
        print(len(tf.config.list_logical_devices("GPU")), "GPUs")
    """)
    out = tmp_path / "out"
    proc = trace(["--gpus", "2", str(script)], cwd=tmp_path, out=out)
    assert "2 GPUs" in proc.stdout
    eager = placement(out)["eager"]
    assert eager["op_types_by_device"]["/GPU:1"]["AssignVariableOp"] == 2  # the initializer and the assign
    assert eager["copies"] == [{"from": "/CPU:0", "to": "/GPU:1", "count": 1, "bytes": 300 * F32,
                                "ops": {"AssignVariableOp": 1}}]
    (var,) = placement(out)["variables"]
    assert (var["devices"], var["update_devices"]) == (["/GPU:1"], ["/GPU:1"])


# ---- issue 34: step metrics reach MLflow by time, each metric's latest value kept ------------------
def test_step_metrics_reach_mlflow_as_logged_up_to_the_budget_then_at_most_once_per_interval(tmp_path):
    """--metrics-every-s 3600: the first 50 calls (tracking.step_metrics_budget) go out as
    logged, every later one is held back (per metric, the latest), and the end of the run sends
    what was held, each at its own step."""
    import json

    from mlflow.tracking import MlflowClient

    from pinpoint.config import TrackingConfig

    budget = TrackingConfig().step_metrics_budget
    assert budget == 50
    script = write(tmp_path, "fast.py", """
        import time
        import pinpoint
        for step in range(1, 401):
            pinpoint.log(step, loss=1.0 / step)
            if step == 300:
                pinpoint.log(step, learning_rate=0.1)
        time.sleep(1.0)  # the held values are sent after this, with the time they were logged
    """)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = tmp_path / "out"
    trace(["--experiment", "thin", "--metrics-every-s", "3600", str(script)], cwd=tmp_path, out=out,
          tracking=True, env={"MLFLOW_TRACKING_URI": uri})
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("thin").experiment_id])
    history = {k: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, k))
               for k in ("loss", "learning_rate")}
    # Calls 1..50 are the loss of steps 1..50; then 3600 s have not passed: held to the end.
    assert history == {"loss": [(s, 1.0 / s) for s in range(1, 51)] + [(400, 1.0 / 400)],
                       "learning_rate": [(300, 0.1)]}
    held = [m for k in ("loss", "learning_rate") for m in client.get_metric_history(run.info.run_id, k)
            if m.step > 50]
    ended = client.get_run(run.info.run_id).info.end_time
    assert [ended - m.timestamp >= 1000 for m in held] == [True, True]  # logged before the sleep
    cost = json.loads((out / "tracking.json").read_text())
    assert cost["run_id"] == run.info.run_id  # what `pinpoint plan --verify` links a source run by
    assert cost["train"]["log_calls"] == 401  # every call counted, sent or held
    assert cost["run"]["sender_cpu_s"] > 0  # read from the sender process's CPU clock


# ---- issue 34: a tf.function call pays an identity test and a counter; the counts stay exact ----------
def test_call_counts_are_exact_for_runs_of_calls_functions_in_turn_and_calls_traced_into_another(tmp_path):
    """Each known function's calls are counted inside TensorFlow's call path (tfcompat.counting)
    and added to its record when the program ends: runs of calls, functions called in turn, a
    zero-argument function, and a traced call (`inner` inside `outer`'s trace: not a call that ran)."""
    script = write(tmp_path, "counts.py", """
        import tensorflow as tf
        x = tf.constant([1.0, 2.0])
        v = tf.Variable(0.0)

        @tf.function
        def inner(t):
            return t * 2.0

        @tf.function
        def other(t):
            return t + 1.0

        @tf.function
        def bump():
            v.assign_add(1.0)

        @tf.function
        def outer(t):
            return inner(t) + 1.0

        for _ in range(130):  # a run of calls past the counter's check every 64
            inner(x)
        for _ in range(7):  # in turn
            inner(x)
            other(x)
            bump()
        inner(x)  # the last function called, then
        outer(x)  # traces a call to inner: not one of inner's calls
        outer(x)
        inner(x)
    """)
    out = tmp_path / "out"
    trace([str(script)], cwd=tmp_path, out=out)
    calls = {f["name"]: f["calls"] for f in placement(out)["functions"]}
    assert calls == {"inner": 139, "other": 7, "bump": 7, "outer": 2}


# ---- issue 34: eager ops are counted until they stop bringing new signatures, and the report says so --
def test_eager_counting_stops_after_a_quiet_window_and_the_report_says_where(tmp_path):
    import json

    from pinpoint.trace.recorder import EAGER_QUIET_OPS as Q

    # 900 adds, a multiply (a new signature: the window starts again), then adds until the window
    # of Q quiet ops passes: the callback goes after the (Q - 900)th add of the last 2 * Q.
    script = write(tmp_path, "quiet.py", f"""
        import tensorflow as tf
        x, y = tf.constant([1.0, 2.0]), tf.constant([3.0, 4.0])
        for _ in range(900):
            tf.add(x, y)
        tf.multiply(x, y)
        for _ in range(2 * {Q}):
            tf.add(x, y)
    """)
    out = tmp_path / "out"
    proc = trace([str(script)], cwd=tmp_path, out=out)
    p = placement(out)
    eager = p["eager"]
    (dev,) = eager["op_types_by_device"]
    assert eager["op_types_by_device"][dev]["AddV2"] == 900 + Q  # of 900 + 2Q run
    assert eager["op_types_by_device"][dev]["Mul"] == 1
    assert (eager["counted_until"], eager["quiet_ops"], eager["sampling_windows"]) == (eager["ops"], Q, 0)
    assert any(n.startswith(f"eager ops: every eager op up to op {eager['ops']} was counted;") for n in p["notes"])
    assert json.loads((out / "metrics.json").read_text())["eager_ops_counted_until"] == eager["ops"]
    assert f"eager ops  : {eager['ops']} (all counted up to op {eager['ops']}, then sampled in 0 window(s))" in proc.stdout


@pytest.mark.parametrize("late", ["new_function", "clock"])
def test_a_signature_that_first_appears_after_the_quiet_window_is_found_in_a_sampling_window(tmp_path, late):
    """After the callback is switched off, an op type never seen before (Sub) still gets recorded:
    the first call of a new tf.function, or a pinpoint.log call once 1 s has passed (the first
    window's wait), switches it on again."""
    from pinpoint.trace.recorder import EAGER_QUIET_OPS as Q

    wake = ("tf.function(lambda a: a * 2.0)(x)" if late == "new_function"
            else "time.sleep(1.5); pinpoint.log(1, loss=0.0)")
    script = write(tmp_path, "late.py", f"""
        import time
        import pinpoint
        import tensorflow as tf
        x, y = tf.constant([1.0, 2.0]), tf.constant([3.0, 4.0])
        for _ in range(2 * {Q}):
            tf.add(x, y)
        {wake}
        for _ in range(5):
            tf.subtract(x, y)
    """)
    out = tmp_path / "out"
    trace([str(script)], cwd=tmp_path, out=out)
    eager = placement(out)["eager"]
    (dev,) = eager["op_types_by_device"]
    # The first add is new, the next Q are quiet: counting stops there; no add runs in the window.
    assert eager["op_types_by_device"][dev]["AddV2"] == Q + 1
    assert eager["op_types_by_device"][dev]["Sub"] == 5
    assert (eager["counted_until"], eager["sampling_windows"]) == (Q + 1, 1)


def test_a_sampling_window_with_nothing_new_ends_after_its_time(tmp_path):
    """A training loop runs an eager op or two a step: a window that waited for EAGER_QUIET_OPS
    quiet callbacks would keep its steps on the slow path for a thousand steps. With nothing new
    for EAGER_WINDOW_S, the next callback (its op counted) switches it off."""
    from pinpoint.trace.recorder import EAGER_QUIET_OPS as Q
    from pinpoint.trace.sampling import EAGER_WINDOW_S

    script = write(tmp_path, "window.py", f"""
        import time
        import tensorflow as tf
        x, y = tf.constant([1.0, 2.0]), tf.constant([3.0, 4.0])
        for _ in range(2 * {Q}):
            tf.add(x, y)
        tf.function(lambda a: a * 2.0)(x)  # a new function: a sampling window
        for _ in range(5):
            tf.subtract(x, y)
        time.sleep({3 * EAGER_WINDOW_S})
        for _ in range(20):
            tf.subtract(x, y)
    """)
    out = tmp_path / "out"
    trace([str(script)], cwd=tmp_path, out=out)
    eager = placement(out)["eager"]
    (dev,) = eager["op_types_by_device"]
    # 5 in the window, then the first after the sleep, whose callback finds the window's time up.
    assert eager["op_types_by_device"][dev]["Sub"] == 6
    assert (eager["counted_until"], eager["sampling_windows"]) == (Q + 1, 1)


def test_eager_ops_under_the_quiet_window_are_all_counted(tmp_path):
    from pinpoint.trace.recorder import EAGER_QUIET_OPS as Q

    script = write(tmp_path, "busy.py", f"""
        import tensorflow as tf
        x, y = tf.constant([1.0, 2.0]), tf.constant([3.0, 4.0])
        for _ in range({Q} - 10):
            tf.add(x, y)
    """)
    out = tmp_path / "out"
    trace([str(script)], cwd=tmp_path, out=out)
    eager = placement(out)["eager"]
    (dev,) = eager["op_types_by_device"]
    assert eager["op_types_by_device"][dev]["AddV2"] == Q - 10
    assert (eager["counted_until"], eager["quiet_ops"]) == (None, None)


# ---- a tf.compat.v1 Session program ---------------------------------------------------------------
def test_session_run_partition_graphs_are_captured(tmp_path):
    script = write(tmp_path, "sess.py", """
        import numpy as np
        import tensorflow as tf
        tf.compat.v1.disable_eager_execution()
        x = tf.compat.v1.placeholder(tf.float32, [None, 4], name="x")
        y = tf.compat.v1.placeholder(tf.float32, [None, 1], name="y")
        with tf.device("/GPU:0"):
            w = tf.compat.v1.get_variable("w", [4, 1], initializer=tf.compat.v1.zeros_initializer(),
                                          use_resource=True)
            pred = tf.matmul(x, w)
        with tf.device("/GPU:1"):
            loss = tf.reduce_mean(tf.square(pred - y), name="loss")
        train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            xs = np.random.RandomState(0).rand(16, 4).astype("float32")
            for _ in range(12):
                sess.run(train_op, feed_dict={x: xs, y: xs.sum(axis=1, keepdims=True)})
    """)
    out = tmp_path / "out"
    trace(["--gpus", "2", str(script)], cwd=tmp_path, out=out)
    p = placement(out)
    train = p["functions"][0]
    assert (train["kind"], train["calls"], train["training"]) == ("Session.run", 12, True)
    assert {r["rule"]: r["score"] for r in p["conformance"]["rules"]} == {"tf.device /GPU:0": 1.0,
                                                                          "tf.device /GPU:1": 1.0}
    # pred ([16, 1] floats, the fed batch) crosses GPU:0 -> GPU:1 for the loss.
    matmul = [i for i in p["transfers"]["largest"] if i["tensor"] == "MatMul"]
    assert [(i["from"], i["to"], i["bytes"]) for i in matmul] == [("/GPU:0", "/GPU:1", 16 * 1 * F32)]
    (w,) = p["variables"]
    assert (w["name"], w["devices"], w["update_devices"]) == ("w", ["/GPU:0"], ["/GPU:0"])


# ---- every way a program ends --------------------------------------------------------------------
ENDINGS = """
    import sys
    import tensorflow as tf

    @tf.function
    def step(v):
        v.assign_add(1.0)

    v = tf.Variable(0.0)
    step(v)
    how = sys.argv[1]
    if how == "exit":
        sys.exit(3)
    if how == "raise":
        def inner():
            raise ValueError("bad batch")
        inner()
    if how == "interrupt":
        raise KeyboardInterrupt
    print("done")
"""


@pytest.mark.parametrize("how, code, status", [("exit", 3, "FAILED"), ("raise", 1, "FAILED"),
                                               ("interrupt", 130, "KILLED"), ("ok", 0, "FINISHED")])
def test_every_ending_keeps_what_was_captured_and_the_programs_exit_code(tmp_path, live_mlflow, how, code, status):
    from mlflow.tracking import MlflowClient

    script = write(tmp_path, "ends.py", ENDINGS)
    out = tmp_path / "out"
    experiment = f"trace-ends-{how}"
    proc = trace(["--experiment", experiment, str(script), how], cwd=tmp_path, out=out, tracking=True,
                 env={"MLFLOW_TRACKING_URI": live_mlflow.uri}, expect=code)
    p = placement(out)
    assert [(f["name"], f["calls"]) for f in p["functions"]] == [("step", 1)]
    assert (out / "report.html").is_file()
    assert json.loads((out / "metrics.json").read_text())["exit_code"] == code
    client = MlflowClient(live_mlflow.uri)
    (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    assert run.info.status == status
    if how == "raise":
        # As Python shows it: the user's frames, none of Pinpoint's, then one pinpoint: line.
        assert 'in inner\n    raise ValueError("bad batch")' in proc.stderr
        assert "ValueError: bad batch" in proc.stderr
        assert "/pinpoint/" not in proc.stderr.split("Traceback")[1].split("ValueError")[0]
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith("pinpoint: ") and "raised ValueError" in last
    if how == "ok":
        assert "done" in proc.stdout


# ---- the launch: the program's process and frames ---------------------------------------------------
WHERE_IT_RUNS = """
    import __main__
    import os
    import sys

    import tensorflow as tf

    frames, frame = [], sys._getframe()
    while frame is not None:
        frames.append(frame.f_code.co_filename)
        frame = frame.f_back
    print("pid", os.getpid())
    print("frames", frames)
    print("main", __main__.__dict__ is globals(), __name__, sys.argv[1:])
    print("sum", int(tf.add(1, 2)))


    def typed(x: int) -> None: ...


    print("annotations", typed.__annotations__)
"""


def test_the_program_runs_in_the_pinpoint_process_with_one_frame_under_it(tmp_path):
    """`pinpoint trace` replaces its own process with the program's (trace.launch): the PID the
    caller started, the interpreter's own `__main__`, and one frame under the program's (BOOT's,
    `<string>`), where `python SCRIPT` has none; the script compiled with its own `__future__`
    flags. A process of its own, not a zygote's fork: the fork's frames are the test harness's."""
    script = write(tmp_path, "where.py", WHERE_IT_RUNS).resolve()
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.Popen([sys.executable, "-m", "pinpoint.cli", "trace", "--no-tracking", "--out",
                             str(tmp_path / "out"), str(script), "--flag"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    said = dict(line.split(" ", 1) for line in stdout.splitlines()
                if line.startswith(("pid ", "frames ", "main ", "annotations ")))
    # Annotations evaluated, as the script's own flags have them (no __future__ of Pinpoint's).
    assert said == {"pid": str(proc.pid), "frames": repr([str(script), "<string>"]),
                    "main": "True __main__ ['--flag']", "annotations": repr({"x": int, "return": None})}
    assert placement(tmp_path / "out")["eager"]["op_types_by_device"] == {"/CPU:0": {"AddV2": 1}}


# ---- a traced program's plan, applied by hand and checked with --verify --against ----------------
MAPPED_LOOP = """
    import json
    import sys

    import keras
    import numpy as np
    import tensorflow as tf

    where = json.load(open(sys.argv[1]))  # layer -> device, and "gradients": the plan's tf_device

    keras.utils.set_random_seed(0)
    layers = {}
    for name, units, width in (("enc", 96, 64), ("mid", 48, 96), ("head", 10, 48)):
        with tf.device(where[name]):  # built and called under the same scope: variables and compute
            layers[name] = keras.layers.Dense(units, activation=None if name == "head" else "relu", name=name)
            layers[name].build((None, width))
    variables = [v for layer in layers.values() for v in layer.trainable_variables]
    optimizer = keras.optimizers.SGD(0.05)
    optimizer.build(variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            h = x
            for name, layer in layers.items():
                with tf.device(where[name]):
                    h = layer(h)
            loss = loss_fn(y, h)
        with tf.device(where["gradients"]):
            grads = tape.gradient(loss, variables)
        optimizer.apply_gradients(zip(grads, variables))
        return loss


    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(32, 64)).astype("float32"))
    y = tf.constant(rng.integers(0, 10, size=32).astype("int32"))
    for step in range(12):
        loss = train_step(x, y)
    print("loss", float(loss))
"""


def test_a_traced_programs_plan_applied_by_hand_is_checked_against_its_new_run(tmp_path, capsys):
    """The program reads its tf.device mapping from a file: traced as first written (everything
    but the head on /GPU:0, the gradients on /GPU:1), planned, run again with the plan's
    tf_device mapping, and the plan held to that run: the bytes per device pair it predicted are
    the new run's, and every layer and the gradients ran where the plan put them."""
    from pinpoint.cli import main

    program = write(tmp_path, "mapped_loop.py", MAPPED_LOOP)
    first = tmp_path / "first.json"
    first.write_text(json.dumps({"enc": "/GPU:0", "mid": "/GPU:0", "head": "/GPU:1", "gradients": "/GPU:1"}))
    source = tmp_path / "source"
    trace(["--gpus", "2", str(program), str(first)], cwd=tmp_path, out=source)
    assert main(["plan", str(source), "--objective", "balance"]) == 0
    plan = yaml.safe_load((source / "plan.yaml").read_text())
    assert set(plan["tf_device"]) == {"enc", "mid", "head", "gradients"}
    applied = tmp_path / "applied.json"
    applied.write_text(json.dumps(plan["tf_device"]))
    again = tmp_path / "again"
    trace(["--gpus", "2", str(program), str(applied)], cwd=tmp_path, out=again)
    capsys.readouterr()
    assert main(["plan", str(source), "--verify", "--against", str(again)]) == 0
    printed = capsys.readouterr().out
    check = json.loads((again / "plan_check.json").read_text())
    assert yaml.safe_load((again / "plan.yaml").read_text())["tf_device"] == plan["tf_device"]
    assert check["bytes"]["exact"] is True and check["bytes"]["measured_total"] > 0
    assert [(r["layer"], r["planned"], r["score"]) for r in check["conformance"]["layers"]] == \
        [(k, plan["tf_device"][k], 1.0) for k in ("enc", "mid", "head")] + \
        [("pinning.gradients", plan["tf_device"]["gradients"], 1.0)]
    assert f"pinpoint: plan checked against {again} -> {again / 'plan_check.json'}" in printed


def test_against_refusals_are_one_line_each(tmp_path, capsys):
    from pinpoint.cli import main

    run = tmp_path / "run"
    run.mkdir()
    for argv, line in [
        (["--against", "x"], "--against: got 'x' without --verify; add --verify to check the plan against that "
                             "run, or drop it"),
        (["--verify", "--against", "x", "--config", "c.yaml"],
         "--config: got 'c.yaml' with --against; --against checks a run made already, --config trains one: pass "
         "one of them"),
        (["--verify", "--against", "x", "--devices", "2"],
         "--devices: got '2' with --against, which checks the plan file as it was written (its devices, objective "
         "and links); drop it"),
    ]:
        assert main(["plan", str(run), *argv]) == 2
        assert capsys.readouterr().err == f"pinpoint: {line}\n"
    assert list(run.iterdir()) == []
