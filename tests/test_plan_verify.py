"""`pinpoint plan RUN_DIR --verify --config CONFIG`: the plan trained and held to measurement.

Integration: a real MLP on 2 emulated GPUs, pinned badly (all on /GPU:0 but the small head), is
planned for balance and the plan trained: the bytes per device pair predicted on the source run's
graph are the verification run's measured transfers exactly (and both are the sums the model's
widths and variables give), every planned layer ran where planned, MLflow has the plan's run
linked to the source, and the verification folder's report has the plan section.
Unit: the one-line refusals, with nothing written."""

from __future__ import annotations

import json

import pytest
import yaml

from pinpoint.cli import main
from pinpoint.placement.model.placement import Placement
from tests.conftest import NO_TRACKING, make_config

BATCH = 32
FEATURES, CLASSES = 64, 10  # the digits data set
BAD_SPLIT = {"dense_1": "/GPU:0", "dense_2": "/GPU:0", "head": "/GPU:1"}
TRAIN = {"strategy": "none", "model": "mlp", "steps": 8, "batch_size": BATCH, "learning_rate": 0.05, "log_every": 2,
         "checkpoint_every": 0, "jit_compile": False, "pinning": {"layers": BAD_SPLIT}}
CLUSTER = {"devices_per_worker": 2, "emulate": True}
PLACEMENT = {"warmup_steps": 2, "sample_steps": 2, "timing": True}


def expected_pairs(plan: dict[str, str], units: dict[str, int], var_bytes: dict[str, int], loss_device: str) -> dict:
    """Bytes per ordered device pair per step of an MLP with layers on `plan`, from its sizes: the
    batch to the first layer and the labels to the loss (from the host), each boundary activation
    forward and its gradient back, the logits to the loss and their gradient back, each layer's
    weight gradients to the optimizer (beside the loss) and its updates back, and the loop's row
    counter (int64: which of the call's index rows is this step's) to the host's input pipeline."""
    out: dict[str, int] = {}

    def add(a: str, b: str, n: int) -> None:
        if a != b:
            out[f"{a} -> {b}"] = out.get(f"{a} -> {b}", 0) + n

    layers = list(units)
    add("/CPU:0", plan[layers[0]], BATCH * FEATURES * 4)
    add("/CPU:0", loss_device, BATCH * 4)  # int32 labels
    add(loss_device, "/CPU:0", 8)
    for a, b in zip(layers, layers[1:], strict=False):
        add(plan[a], plan[b], BATCH * units[a] * 4)
        add(plan[b], plan[a], BATCH * units[a] * 4)
    add(plan[layers[-1]], loss_device, BATCH * CLASSES * 4)
    add(loss_device, plan[layers[-1]], BATCH * CLASSES * 4)
    for layer in layers:
        add(plan[layer], loss_device, var_bytes[layer])
        add(loss_device, plan[layer], var_bytes[layer])
    return out


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_verified_layer_split_has_exact_bytes_full_conformance_and_a_report(tmp_path, tf, capsys):
    from mlflow.tracking import MlflowClient

    from pinpoint.placement.report.html import write_report
    from pinpoint.training.command import train_command
    from pinpoint.training.loop.models import build_model, layer_names

    source = tmp_path / "source"
    cfg = make_config("plan-src", cluster=CLUSTER, train=TRAIN, tracking=NO_TRACKING, placement=PLACEMENT)
    assert train_command(cfg, source) == 0
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config = make_config("plan-verify", cluster=CLUSTER, train=TRAIN, placement=PLACEMENT,
                         tracking={"uri": uri, "experiment": "plan-verify", "log_model": False},
                         path=tmp_path / "verify.yaml")
    vdir = tmp_path / "verify"
    capsys.readouterr()
    assert main(["plan", str(source), "--objective", "balance", "--verify", "--config", str(config),
                 "--verify-out", str(vdir)]) == 0
    printed = capsys.readouterr().out
    check = json.loads((vdir / "plan_check.json").read_text())
    plan = check["pinning"]["layers"]
    assert yaml.safe_load((vdir / "plan.yaml").read_text())["pinning"]["layers"] == plan
    assert set(plan.values()) == {"/GPU:0", "/GPU:1"}  # a real split: the head alone was the bad one

    # Bytes: the prediction on the source run's graph is the verification run's measurement, pair
    # by pair, and both are what the model's sizes give for the plan.
    names = layer_names("mlp")
    units = {layer.name: layer.units for layer in build_model("mlp", (FEATURES,), CLASSES).stack}
    placement = json.loads((vdir / "placement.json").read_text())
    var_bytes = {n: sum(v["bytes"] for v in placement["variables"] if v["name"].startswith(n + "/")) for n in names}
    widths_in = [FEATURES, *(units[n] for n in names[:-1])]
    assert var_bytes == {n: (w + 1) * units[n] * 4 for w, n in zip(widths_in, names, strict=True)}  # kernel + bias
    expected = expected_pairs(plan, {n: units[n] for n in names}, var_bytes, loss_device="/GPU:0")
    assert {r["pair"]: r["predicted"] for r in check["bytes"]["pairs"]} == expected
    assert {r["pair"]: r["measured"] for r in check["bytes"]["pairs"]} == expected
    assert check["bytes"]["exact"] is True
    assert check["bytes"]["predicted_total"] == check["bytes"]["measured_total"] == sum(expected.values())

    # Conformance: every planned layer's forward and backward ops ran on its planned device.
    assert check["conformance"]["score"] == 1.0
    assert check["conformance"]["deviations"] == []
    assert [(r["layer"], r["planned"], list(r["observed"])) for r in check["conformance"]["layers"]] == \
        [(n, plan[n], [plan[n]]) for n in names]
    assert check["emulated"] is True and check["step"]["note"].startswith("emulated GPUs")
    assert check["step"]["measured_ms"] > 0 and check["step"]["predicted_ms"] > 0
    assert "(exact)" in printed and "conformance of the plan's layers: 1.0 (0 deviation(s))" in printed

    # MLflow: the plan's step run of the verification folder, linked to the source folder, the
    # parent of the verification's train run.
    c = MlflowClient(uri)
    (run,) = c.search_runs([c.get_experiment_by_name("plan-verify").experiment_id],
                           filter_string="tags.`pinpoint.step` = 'plan'")
    assert run.data.params["plan.objective"] == "balance"
    assert run.data.params["plan.algorithm"] == check["algorithm"]
    assert run.data.metrics["plan.bytes_exact"] == 1.0
    assert run.data.metrics["plan.conformance"] == 1.0
    assert run.data.metrics["plan.predicted_step_ms"] == check["step"]["predicted_ms"]
    assert run.data.metrics["plan.measured_step_ms"] == check["step"]["measured_ms"]
    assert run.data.tags["pinpoint.plan.source_run"] == str(source.resolve())
    assert sorted(a.path for a in c.list_artifacts(run.info.run_id)) == ["plan.yaml", "plan_check.json"]
    (trained,) = c.search_runs([run.info.experiment_id], filter_string="tags.`pinpoint.step` = 'train'")
    assert trained.data.tags["mlflow.parentRunId"] == run.info.run_id  # the plan's run holds its training

    # The report of the verification folder: the plan section with its table and timeline.
    html = write_report(vdir)[0].read_text()
    assert '<section id="plan">' in html and 'alt="simulated step per device' in html
    assert "verified (measured)" in html and (vdir / "charts" / "plan_timeline.png").is_file()


# ---- refusals: one line, nothing written ------------------------------------------------------
@pytest.fixture
def run(tmp_path):
    from tests.test_plan_search import _run_folder

    return _run_folder(tmp_path)


def _refused(argv, capsys, run, vdir) -> str:
    before = sorted(p.name for p in run.iterdir())
    assert main(argv) == 2
    assert sorted(p.name for p in run.iterdir()) == before  # no plan.yaml
    assert not vdir.exists()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("pinpoint: ")
    return err.strip()


@pytest.mark.unit
def test_a_config_whose_model_lacks_the_plans_layers_is_one_line(run, tmp_path, capsys):
    cfg = make_config("v", cluster=CLUSTER, train=dict(TRAIN, pinning={}), tracking=NO_TRACKING,
                      path=tmp_path / "c.yaml")
    vdir = tmp_path / "v"
    assert _refused(["plan", str(run), "--objective", "balance", "--verify", "--config", str(cfg),
                     "--verify-out", str(vdir)], capsys, run, vdir) == (
        f"pinpoint: train.model: got 'mlp' in {cfg}, which has no layer enc of the plan (its layers: dense_1, "
        f"dense_2, head); verify with the config the run {run} was trained with")


@pytest.mark.unit
@pytest.mark.parametrize("train, line", [
    ({"strategy": "mirrored", "pinning": {}}, "train.strategy: got 'mirrored' in {cfg}; a plan of layers over "
     "devices trains with strategy 'none' (model parallelism); set train.strategy: none"),
    ({"entrypoint": "mine.train:step", "pinning": {}}, "train.entrypoint: got 'mine.train:step' in {cfg}; --verify "
     "trains with Pinpoint's own loop (train.model), which pinning.layers steers; apply the plan's tf_device "
     "mapping in your program, run it again, then check it with `pinpoint plan RUN_DIR --verify --against "
     "NEW_RUN`"),
])
def test_a_config_that_cannot_train_the_plan_is_one_line(run, tmp_path, capsys, train, line):
    # An entrypoint's config writes none of the loop's fields (they would be refused at load).
    train = {"strategy": "none", **train} if "entrypoint" in train else dict(TRAIN, **train)
    cfg = make_config("v", cluster=CLUSTER, train=train, tracking=NO_TRACKING, path=tmp_path / "c.yaml")
    vdir = tmp_path / "v"
    assert _refused(["plan", str(run), "--objective", "balance", "--verify", "--config", str(cfg),
                     "--verify-out", str(vdir)], capsys, run, vdir) == "pinpoint: " + line.format(cfg=cfg)


@pytest.mark.unit
def test_verify_flags_are_one_line_each(run, tmp_path, capsys):
    vdir = tmp_path / "v"
    assert _refused(["plan", str(run), "--verify", "--verify-out", str(vdir)], capsys, run, vdir) == (
        "pinpoint: --config: got nothing; --verify trains a config with the plan: pass the run's config "
        "(pinpoint plan RUN_DIR --verify --config CONFIG)")
    assert _refused(["plan", str(run), "--config", "c.yaml"], capsys, run, vdir) == (
        "pinpoint: --config: got 'c.yaml' without --verify; add --verify to train the plan, or drop it")
    # A user model (its layers are known once built, so the plan's enc and dec pass the config check).
    cfg = make_config("v", cluster=CLUSTER, train=dict(TRAIN, model="mine.models:two_layers", pinning={}),
                      tracking=NO_TRACKING, path=tmp_path / "c.yaml")
    full = tmp_path / "full"
    full.mkdir()
    (full / "placement.json").write_text("{}")
    before = sorted(p.name for p in run.iterdir())
    assert main(["plan", str(run), "--verify", "--config", str(cfg), "--verify-out", str(full)]) == 2
    assert capsys.readouterr().err == (f"pinpoint: --verify-out: got '{full}', which already holds files; pass a new "
                                       "or empty folder\n")
    assert sorted(p.name for p in run.iterdir()) == before


@pytest.mark.unit
def test_every_deviation_is_named_with_its_cause():
    """A layer rule's violations: the rule's own why, else the run's fallback reason for the op,
    else the placer's choice; a planned layer with no rule at all is a deviation too."""
    from pinpoint.plan.verify import compare_conformance

    placement = {
        "conformance": {"rules": [
            {"rule": "layers.enc", "planned": "/GPU:0", "score": 0.5, "observed": {"/GPU:0": 1, "/CPU:0": 1},
             "violations": [{"op": "m/enc/Lookup", "placed": "/CPU:0"}]},
            {"rule": "layers.dec", "planned": "/GPU:1", "score": 0.75, "observed": {"/GPU:1": 3, "/GPU:0": 1},
             "violations": [{"op": "m/dec/Scatter", "placed": "/GPU:0", "why": "colocated with its variable"},
                            {"op": "m/dec/Mul", "placed": "/GPU:0"}]},
        ]},
        "fallbacks": [{"op": "m/enc/Lookup", "reason": "no GPU kernel for StringToHashBucketFast"}],
    }
    got = compare_conformance(Placement.from_json(placement), {"enc": "/GPU:0", "dec": "/GPU:1", "head": "/GPU:1"})
    assert got["score"] == round((0.5 + 0.75 + 0.0) / 3, 4)
    assert got["deviations"] == [
        {"layer": "enc", "op": "m/enc/Lookup", "placed": "/CPU:0", "cause": "no GPU kernel for StringToHashBucketFast"},
        {"layer": "dec", "op": "m/dec/Scatter", "placed": "/GPU:0", "cause": "colocated with its variable"},
        {"layer": "dec", "op": "m/dec/Mul", "placed": "/GPU:0",
         "cause": "placed off the layer's device with no recorded fallback (the placer's choice)"},
        {"layer": "head", "op": None, "placed": None,
         "cause": "the verification run has no layers rule for it (no op matched the layer)"},
    ]


@pytest.mark.unit
def test_bytes_compare_pair_by_pair_and_a_pair_on_one_side_only_counts_as_zero():
    from pinpoint.plan.verify import compare_bytes

    got = compare_bytes({"/GPU:0 -> /GPU:1": 100, "/CPU:0 -> /GPU:0": 8},
                        {"/GPU:0 -> /GPU:1": 100, "/CPU:0 -> /GPU:0": 16, "/GPU:1 -> /CPU:0": 0})
    assert got == {"pairs": [{"pair": "/CPU:0 -> /GPU:0", "predicted": 8, "measured": 16, "exact": False},
                             {"pair": "/GPU:0 -> /GPU:1", "predicted": 100, "measured": 100, "exact": True}],
                   "exact": False, "predicted_total": 108, "measured_total": 116}


@pytest.mark.unit
def test_a_folder_with_only_a_plan_file_gets_the_prediction_table(run, capsys):
    """`pinpoint plan` without --verify: the report's plan section shows each placement's
    predicted figures (nothing measured, no timeline); a folder without a plan has no section."""
    from pinpoint.placement.report.html import read_plan_check, render_html

    assert read_plan_check(run) is None
    assert '<section id="plan">' not in render_html({}, None, {}, "t", plan=read_plan_check(run))
    assert main(["plan", str(run), "--objective", "balance"]) == 0
    doc = yaml.safe_load((run / "plan.yaml").read_text())
    html = render_html({}, None, {}, "t", plan=read_plan_check(run))
    section = html[html.index('<section id="plan">'):]
    section = section[:section.index("</section>")]
    for name, p in doc["prediction"].items():
        assert f"<td>{name}</td><td class=\"num\">{p['step_ms']:.3f}</td><td>predicted</td>" in section
    assert "verified (measured)" not in section and "<img" not in section


@pytest.mark.unit
def test_the_source_run_is_linked_by_its_mlflow_id_when_its_folder_records_one(tmp_path):
    """tracking.json (written at a tracked run's close) names the MLflow run; without it, the folder."""
    from pinpoint.steps.verify import source_run_link

    assert source_run_link(tmp_path) == str(tmp_path.resolve())
    (tmp_path / "tracking.json").write_text(json.dumps({"run_id": "0123abcd", "train": {}, "close_s": 0.1}))
    assert source_run_link(tmp_path) == "0123abcd"


# ---- parameter-server plans: the strategy and the ps tasks must fit the plan ------------------
PS_DEVICES = [f"/job:ps/task:{i}/CPU:0" for i in range(4)]
PS_CLUSTER = {"chief": 1, "workers": 1, "ps": 4, "devices_per_worker": 1}
PS_TRAIN = dict(TRAIN, strategy="parameter_server", model="mine.models:stack", pinning={})


def _ps_plan(servers=PS_DEVICES) -> dict:
    """A plan document over parameter servers, as `pinpoint plan` writes one for a ps run."""
    return {"devices": list(servers), "source_run": "runs/rr",
            "pinning": {"layers": {"h0": servers[0], "h1": servers[-1]}}}


@pytest.mark.unit
def test_a_ps_plan_with_a_config_of_another_strategy_is_refused():
    from pinpoint.errors import ConfigError
    from pinpoint.plan.verify import verify_config

    cfg = make_config("v", cluster=CLUSTER, train=dict(TRAIN, model="mine.models:stack", pinning={}),
                      tracking=NO_TRACKING)
    with pytest.raises(ConfigError) as err:
        verify_config(cfg, _ps_plan(), "c.yaml")
    assert str(err.value) == ("train.strategy: got 'none' in c.yaml, but the plan places variables on parameter "
                              f"servers ({', '.join(PS_DEVICES)}); set train.strategy: parameter_server")


@pytest.mark.unit
def test_a_ps_plan_with_too_few_ps_tasks_is_refused():
    from pinpoint.errors import ConfigError
    from pinpoint.plan.verify import verify_config

    cfg = make_config("v", cluster=dict(PS_CLUSTER, ps=2), train=PS_TRAIN, tracking=NO_TRACKING)
    with pytest.raises(ConfigError) as err:
        verify_config(cfg, _ps_plan(), "c.yaml")
    assert str(err.value) == ("cluster.ps: got 2 in c.yaml, but the plan uses /job:ps/task:3/CPU:0; "
                              "set cluster.ps: 4 or more")


@pytest.mark.unit
def test_a_ps_plan_trains_with_its_pins_under_parameter_server():
    """The config that trains a ps plan: its pins as pinning.layers, captured and timed, its
    cluster (a chief, a worker, the plan's four ps tasks) as given."""
    from pinpoint.plan.verify import verify_config

    cfg = make_config("v", cluster=PS_CLUSTER, train=PS_TRAIN, tracking=NO_TRACKING)
    got = verify_config(cfg, _ps_plan(), "c.yaml")
    assert (got.train.strategy, got.cluster.ps, got.train.pinning.layers, got.placement.enabled,
            got.placement.timing) == ("parameter_server", 4, {"h0": PS_DEVICES[0], "h1": PS_DEVICES[3]}, True, True)


@pytest.mark.unit
def test_a_gpu_plan_with_a_parameter_server_config_is_one_line(run, tmp_path, capsys):
    cfg = make_config("v", cluster=PS_CLUSTER, train=PS_TRAIN, tracking=NO_TRACKING, path=tmp_path / "c.yaml")
    vdir = tmp_path / "v"
    assert _refused(["plan", str(run), "--objective", "balance", "--verify", "--config", str(cfg),
                     "--verify-out", str(vdir)], capsys, run, vdir) == (
        f"pinpoint: train.strategy: got 'parameter_server' in {cfg}, but the plan places layers on /GPU:0, /GPU:1, "
        f"not on parameter servers; set train.strategy to the one the run {run} was trained with, or plan a "
        "parameter_server run")


@pytest.mark.unit
def test_bytes_per_server_compare_server_by_server_with_the_largest_over_the_mean():
    from pinpoint.plan.verify import compare_servers

    a, b = PS_DEVICES[:2]
    got = compare_servers({a: 300, b: 100}, {a: 300, b: 104})
    assert got == {"servers": [{"server": a, "predicted": 300, "measured": 300, "exact": True},
                               {"server": b, "predicted": 100, "measured": 104, "exact": False}],
                   "exact": False, "predicted_total": 400, "measured_total": 404,
                   "predicted_largest_over_mean": 1.5, "measured_largest_over_mean": round(300 * 2 / 404, 4)}


@pytest.mark.unit
def test_a_verified_ps_plan_logs_whether_its_bytes_per_server_were_exact():
    from pinpoint.steps.verify import plan_figures

    doc = {"objective": "balance", "algorithm": "LPT over parameter servers", "devices": PS_DEVICES,
           "source_run": "runs/rr"}
    check = {"bytes": {"exact": True, "predicted_total": 10, "measured_total": 10},
             "ps_bytes": {"exact": False}, "conformance": {"score": 1.0},
             "step": {"predicted_ms": None, "measured_ms": 20.5}}
    assert plan_figures(doc, check)[1] == {"plan.bytes_exact": 1.0, "plan.bytes_predicted": 10.0,
                                           "plan.bytes_measured": 10.0, "plan.ps_bytes_exact": 0.0,
                                           "plan.conformance": 1.0, "plan.measured_step_ms": 20.5}
