"""`pinpoint trace`'s pure parts: the command line (everything after the program is the program's),
function names, which function is the training one and `pinpoint.log` without a run."""

from __future__ import annotations

import pytest

from pinpoint.cli import split_trace_argv
from pinpoint.trace.analysis import pick_training
from pinpoint.trace.recorder import python_name

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("argv, front, rest", [
    (["trace", "train.py", "--epochs", "3", "-v"], ["trace", "train.py"], ["--epochs", "3", "-v"]),
    (["trace", "--gpus", "2", "--out", "o", "-m", "pkg.mod", "--gpus", "4"],
     ["trace", "--gpus", "2", "--out", "o", "-m", "pkg.mod"], ["--gpus", "4"]),
    (["-v", "trace", "--no-tracking", "x.py"], ["-v", "trace", "--no-tracking", "x.py"], []),
    (["train", "c.yaml", "--out", "o"], ["train", "c.yaml", "--out", "o"], []),
])
def test_everything_after_the_program_is_the_programs(argv, front, rest):
    assert split_trace_argv(argv) == (front, rest)


def test_concrete_function_names_become_the_python_names():
    assert python_name("__inference_one_step_on_iterator_1234") == "one_step_on_iterator"
    assert python_name("__inference_train_step_7") == "train_step"
    assert python_name("Session.run(loss:0)") == "Session.run(loss:0)"


def _row(name, calls, updates, ops=10, keras=None):
    from pinpoint.trace.analysis import role_of

    return {"name": name, "calls": calls, "variable_updates": updates, "optimizer_updates": updates,
            "ops_per_call": ops, "role": role_of(name, keras, updates, updates)}


def test_the_training_function_updates_variables_and_keras_names_win():
    rows = [_row("predict_step", 500, 0), _row("step", 40, 3), _row("multi_step_on_iterator", 30, 8)]
    assert pick_training(rows)["name"] == "multi_step_on_iterator"
    assert pick_training([_row("predict_step", 500, 0), _row("my_update", 40, 3)])["name"] == "my_update"
    # TensorFlow's own checkpoint functions never are, even when nothing else updates variables.
    assert pick_training([_row("tf_function_save", 3, 5), _row("step", 30, 0)])["name"] == "step"
    assert pick_training([]) is None
    # A coordinator's per-worker dataset_fn (uncaptured, one call per worker) never is, calls tied or not.
    assert pick_training([_row("dataset_fn", 2, 0, ops=0), _row("worker_fn", 2, 0, ops=0)])["name"] == "worker_fn"


def test_keras_evaluate_function_has_its_role_and_is_not_the_training_function():
    # Keras names fit's and evaluate's functions alike; the method on the stack tells them apart.
    train = _row("multi_step_on_iterator", 4, 8, keras="train")
    evaluate = _row("multi_step_on_iterator", 40, 0, keras="evaluate")
    assert (train["role"], evaluate["role"]) == ("train", "evaluate")
    assert pick_training([evaluate, train]) is train
    assert [_row(n, 1, 0)["role"] for n in ("test_step", "predict_step", "train_step", "helper")] == [
        "evaluate", "predict", "train", "other"]


def test_keras_role_is_the_innermost_keras_method_on_the_stack():
    import types

    from pinpoint.trace.recorder import keras_role

    def frame(name, filename, back):
        return types.SimpleNamespace(f_code=types.SimpleNamespace(co_name=name, co_filename=filename), f_back=back)

    fit = frame("fit", "/x/site-packages/keras/src/backend/tensorflow/trainer.py", None)
    validation = frame("evaluate", "/x/site-packages/keras/src/backend/tensorflow/trainer.py", fit)
    user = frame("evaluate", "/home/me/my_model.py", frame("main", "/home/me/run.py", None))
    assert keras_role(frame("call", "/x/f.py", validation)) == "evaluate"
    assert keras_role(frame("call", "/x/f.py", fit)) == "train"
    assert keras_role(user) is None


def test_pinpoint_log_does_nothing_without_a_run_and_sends_with_one():
    import pinpoint
    from pinpoint import userlog

    pinpoint.log(3, loss=0.5)  # no run: nothing happens, nothing raises
    got = []
    userlog.set_sink(lambda step, metrics: got.append((step, metrics)))
    try:
        pinpoint.log(7, loss=0.25, accuracy=1)
    finally:
        userlog.set_sink(None)
    assert got == [(7, {"loss": 0.25, "accuracy": 1.0})]


def test_a_graph_execution_error_is_told_by_its_cause_not_the_node_trailer():
    import tensorflow as tf

    from pinpoint.trace.recorder import error_line

    err = tf.errors.InvalidArgumentError(None, None, "Graph execution error:\n\nDetected at node X defined at:\n"
                                         "  File \"a.py\", line 8, in f\n\nbad input : Tensor had NaN values\n"
                                         "\t [[{{node CheckNumerics}}]] [Op:__inference_fn_with_cond_62]")
    assert error_line(err) == "InvalidArgumentError: bad input : Tensor had NaN values"


def test_a_long_program_name_cut_to_32_characters_is_still_a_dns_name():
    from pinpoint.trace.session import trace_config

    # Cut at 32 characters, 'transformer_ps_parameter_server_f32' would end in '-'.
    assert trace_config("transformer_ps_parameter_server_f32", tracking=False).name == "transformer-ps-parameter-server"
    assert trace_config("1234567890123456789012345678_x", tracking=False).name == "trace-12345678901234567890123456"


def test_a_program_splitting_the_host_cpu_beyond_the_kept_cpus_is_told_where_the_rest_runs():
    """Up to FIRST_GPU CPUs (the host and the ones kept for the program) are its own: nothing to
    say. One more names the emulated /GPU:0's logical CPU."""
    from types import SimpleNamespace

    from pinpoint.trace.gpus import FIRST_GPU, _not_applied

    host = SimpleNamespace(device_type="CPU")
    assert FIRST_GPU == 8
    assert _not_applied("set_logical_device_configuration", (host, [None] * 8), 2, FIRST_GPU) is None
    assert _not_applied("set_logical_device_configuration", (host, [None] * 9), 2, FIRST_GPU) == (
        "set_logical_device_configuration: the program split the host CPU into 9 logical CPUs; under --gpus 2 "
        "emulation keeps 8 for it: tf.config lists its 9 CPUs, but a request for /CPU:8../CPU:9 runs on the "
        "emulated /GPU:0../GPU:1 (and is listed there) and a higher one does not exist and is soft-placed")


def test_a_later_fit_logs_only_what_changed_under_its_own_number():
    """MLflow keeps one value per param: the second fit's other strategy is `fit2.strategy`, its
    unchanged batch size is not sent again, a param the first fit lacked is sent as it is."""
    from pinpoint.trace.session import Capture

    sent = []
    cap = Capture(dm=None, params=sent.append)
    cap.log_fit_params({"fit.strategy": "OneDeviceStrategy", "fit.batch_size": 64})
    cap.log_fit_params({"fit.strategy": "OneDeviceStrategy", "fit.batch_size": 64})
    cap.log_fit_params({"fit.strategy": "MirroredStrategy", "fit.batch_size": 64, "fit.epochs": 2})
    assert sent == [{"fit.strategy": "OneDeviceStrategy", "fit.batch_size": 64},
                    {"fit3.strategy": "MirroredStrategy", "fit.epochs": 2}]


def test_a_known_functions_calls_are_counted_by_the_class_its_call_makes_and_a_traced_call_is_taken_back():
    """tfcompat.counting on stand-ins for TensorFlow's classes: the counter class's __init__ runs
    once per call (as call_flat makes InterpolateRuntimeError(self)), make_call_op_in_graph once
    per call added to a graph; a function not known yet is not counted there (its slow path counts
    it); the sampling window is asked about every 64 calls of a function."""
    from pinpoint.tfcompat.counting import counting_hooks, forget, know, take_count

    class Interpolate:  # TensorFlow's: __init__ keeps the function, __exit__ reads it
        def __init__(self, top_level_func):
            self._func = top_level_func

    class Function:
        def call_flat(self, *args):
            return ("own", self, args)

    asked = []
    counter_class, in_graph = counting_hooks(Interpolate, lambda atomic, *a: ("graph", atomic), lambda: asked.append(1))
    known, unknown = Function(), Function()
    know(known, Function.call_flat)
    assert known.call_flat(1, 2) == ("own", known, (1, 2))  # TensorFlow's own, bound: no frame of Pinpoint's
    for _ in range(130):
        assert counter_class(known)._func is known
    counter_class(unknown)
    assert (in_graph(known, [], None), in_graph(unknown, [], None)) == (("graph", known), ("graph", unknown))
    assert (take_count(known), take_count(unknown), len(asked)) == (129, 0, 2)  # 130 - 1; at 64 and 128
    assert take_count(known) == 0  # taken
    forget(known)
    assert ("call_flat" in vars(known), take_count(known)) == (False, 0)
