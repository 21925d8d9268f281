"""What `make bench` measures: the comparisons, their arms (one worker spec each) and ratios."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from benchmarks import targets

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "configs" / "demo.yaml"
# The worked example of the user-code contract (issue 13): the user's CNN on TFRecord files.
EXAMPLE = ROOT / "examples" / "digits_cnn"
OUT = ROOT / "benchmarks" / "out"  # run.py's default --out


@dataclass(frozen=True)
class Settings:
    repeats: int = 5
    steps: int = 2000  # steps of the Pinpoint-vs-Keras runs
    warmup_steps: int = 200  # excluded from the steady state
    overhead_steps: int = 500  # issue 4.6: a 500-step run, capture on vs off
    # Capture on/off differ by ~2% in a ~1.2 s run whose run-to-run noise is ~10%: twice
    # the rounds for those two arms (14 s each); the MLflow arm keeps `repeats` rounds.
    overhead_repeat_factor: int = 2
    # A Pinpoint-vs-Keras row without a target is recorded, not judged: fewer rounds (each is
    # two 15-20 s runs) keep the full run within its 50 minutes.
    recorded_repeats: int = 2  # (issue 34's longer tracking runs and per-call section need the time)
    scaling_devices: tuple[int, ...] = (1, 2, 4)
    per_replica_batch: int = 32
    make_run_repeats: int | None = None  # default: repeats
    gpus: int = 0  # real GPUs on this machine (0: GPUs are emulated on logical CPU devices)


@dataclass(frozen=True)
class Arm:
    name: str
    label: str
    spec: dict = field(default_factory=dict)
    reuse: tuple[str, str] | None = None  # (comparison, arm) whose runs this arm shares
    max_rounds: int | None = None  # run only in the first max_rounds rounds of its comparison


@dataclass(frozen=True)
class Ratio:
    label: str
    num: str
    den: str
    metric: str
    target: str | None = None  # benchmarks.targets.target(KEY): every target is declared there only
    difference: bool = False  # num - den (e.g. seconds of fixed cost) instead of num / den
    # den "": not a ratio but num's own value (e.g. `make run`'s wall time <= 30 s).
    # A list field of num's records pooled over the rounds instead of one value per round (e.g.
    # the per-call microbenchmarks' pairs of blocks): its median and interval.
    pooled: str | None = None


@dataclass(frozen=True)
class Prepare:
    """A command run once before a comparison's first round (e.g. writing the files it reads):
    `python ARGV...` from the repository root, with `pythonpath` first on PYTHONPATH."""

    argv: tuple[str, ...]
    pythonpath: str = ""


@dataclass(frozen=True)
class Comparison:
    key: str
    title: str
    arms: tuple[Arm, ...]
    ratios: tuple[Ratio, ...] = ()
    note: str = ""
    skipped: str = ""  # why this comparison cannot run on this machine
    repeats: int | None = None  # rounds, when not Settings.repeats
    prepare: Prepare | None = None
    # A real `mlflow server` runs for the comparison; arms whose tracking.uri is SERVER_URI use it.
    mlflow_server: bool = False
    # The plan's time estimate: seconds one run of an arm takes on the bench machine (process
    # wall, measured), and the comparison's own fixed cost (prepare, server start).
    run_s: float = 0.0
    setup_s: float = 0.0
    # Issue 34.3: more rounds than `repeats` while a targeted interval is wider than ±3% of its
    # median, until this many seconds of the comparison's runs (None: `repeats` rounds only).
    time_cap_s: float | None = None
    section: str = ""  # the key of the section that runs it (set by build_plan)


def rounds(comp: Comparison, s: Settings) -> int:
    return comp.repeats or s.repeats


def own_runs(comp: Comparison, s: Settings, keys: set[str]) -> int:
    """Runs the comparison makes itself: arms reusing a comparison of the plan (`keys`) make none."""
    n = rounds(comp, s)
    return sum(min(n, a.max_rounds or n) for a in comp.arms if not (a.reuse and a.reuse[0] in keys))


def plan_seconds(plan: list[Comparison], s: Settings) -> dict[str, float]:
    """The estimated seconds of each comparison the plan runs (skipped ones: 0)."""
    keys = {c.key for c in plan if not c.skipped}
    return {c.key: 0.0 if c.skipped else max(own_runs(c, s, keys) * c.run_s, c.time_cap_s or 0.0) + c.setup_s
            for c in plan}


# Tracking runs: this many times the Keras rows' steps (a steady window of several seconds).
TRACKING_STEPS_FACTOR = 2
SERVER_URI = "@mlflow-server@"  # replaced by the comparison's server address (run.py)


def demo_config() -> dict:
    return yaml.safe_load(DEMO.read_text())


def bench_config(name: str, *, strategy: str, devices: int, steps: int, batch: int,
                 workers: int = 0, placement: bool = True, tracking: bool = False,
                 checkpoint_every: int = 0) -> dict:
    """The demo config (model, data, optimizer, learning rate), resized for one benchmark arm. The
    demo's placement.timing and placement.memory are off here: an arm measures what it turns on."""
    cfg = copy.deepcopy(demo_config())
    cfg["name"] = name
    cfg["cluster"].update(chief=1, workers=workers, ps=0, evaluator=0, devices_per_worker=devices)
    cfg["train"].update(strategy=strategy, steps=steps, batch_size=batch, checkpoint_every=checkpoint_every)
    cfg["tracking"] = dict(cfg.get("tracking") or {}, enabled=tracking, experiment="pinpoint-bench")
    cfg["placement"] = dict(cfg.get("placement") or {}, enabled=placement, timing=False, memory=False)
    return cfg


def user_model_config(name: str, *, steps: int, batch: int, data_dir: Path) -> dict:
    """The worked example's config (its model, features, optimizer, learning rate), for one arm:
    strategy none on 1 device without layer pinning (`fit` cannot pin layers), its TFRecord files
    read from `data_dir` (written by the bench, not into the source tree), checkpoints and MLflow
    off like the other Pinpoint-vs-Keras arms."""
    cfg = yaml.safe_load((EXAMPLE / "config.yaml").read_text())
    t = cfg["train"]
    cfg["name"] = name
    cfg["cluster"].update(chief=1, workers=0, ps=0, evaluator=0, devices_per_worker=1)
    t["pinning"] = {k: v for k, v in (t.get("pinning") or {}).items() if k != "layers"}
    pattern = Path(t["data"].partition(":")[2]).name  # tfrecord:data/digits-*.tfrecord -> digits-*.tfrecord
    t.update(strategy="none", steps=steps, batch_size=batch, checkpoint_every=0, code_dir=str(EXAMPLE),
             data=f"tfrecord:{data_dir / pattern}")
    cfg["tracking"] = dict(cfg.get("tracking") or {}, enabled=False, experiment="pinpoint-bench")
    cfg["placement"] = dict(cfg.get("placement") or {}, enabled=True)
    return cfg


def _pair_user_model(s: Settings, b2: int, out: Path) -> Comparison:
    data_dir = out.resolve() / "keras-user-model" / "data"
    cfg = user_model_config("bench-user-model", steps=s.steps, batch=b2, data_dir=data_dir)
    t = cfg["train"]
    args = ", ".join(f"{k}={v}" for k, v in t.get("model_args", {}).items())
    return _pair(
        "keras-user-model", "worked example: the user's CNN on TFRecord files (examples/digits_cnn), strategy none, 1 device",
        cfg, s,
        note=(f"both sides build the model with the user's callable `{t['model']}` ({args}, seed {t['seed']}) and "
              f"read the same TFRecord files (written by `digits_cnn.data.write_tfrecords` into the bench's output "
              f"folder) with the example's feature spec; {t['optimizer']} at learning rate {t['learning_rate']}, "
              f"global batch {b2}; Keras reads them with tf.data (parse, shuffle, repeat, batch, prefetch). "
              "Strategy none on 1 device and no layer pinning on either side: the example's `pinning.layers` is "
              "dropped, since `fit` cannot pin layers. XLA as Pinpoint decides for the config on both sides (a user "
              "model: off unless `train.jit_compile: true`)."),
        # No matmul peak: it serves MFU, whose FLOPs count knows Dense-only models (a few seconds per run).
        peak=False,
        prepare=Prepare(("-m", "digits_cnn.data", str(data_dir)), pythonpath=str(EXAMPLE)),
        run_s=11.8,  # the full run at a8abac4: 54.8 s, 10 s of it the data's preparation, for 4 runs; +5%
    )


def _pair(key: str, title: str, cfg: dict, s: Settings, *, note: str = "", skipped: str = "", peak: bool = True,
          prepare: Prepare | None = None, run_s: float, repeats: int | None = None) -> Comparison:
    common = {"config": cfg, "warmup_steps": s.warmup_steps, "peak": peak}
    target = targets.target("keras.steady") if key in ("keras-none", "keras-mirrored") else None
    return Comparison(
        key=key,
        title=title,
        arms=(
            Arm("pinpoint", "pinpoint train", dict(common, kind="pinpoint")),
            Arm("keras", "Keras model.fit", dict(common, kind="keras_mwm" if cfg["cluster"]["workers"] else "keras")),
        ),
        ratios=(Ratio("pinpoint / Keras examples/sec", "pinpoint", "keras", "examples_per_sec", target),),
        note=note,
        skipped=skipped,
        repeats=repeats or (None if target else min(s.repeats, s.recorded_repeats)),
        prepare=prepare,
        run_s=run_s,
        setup_s=10.0 if prepare else 0.0,
    )


def _pair_builtin(s: Settings, b2: int, model: str) -> Comparison:
    """Issue 15.8: a bigger built-in than the 17k-parameter MLP, same data (digits), strategy none
    on 1 device; both sides build it with `build_model` and use Pinpoint's XLA choice."""
    cfg = bench_config(f"bench-{model}", strategy="none", devices=1, steps=s.steps, batch=b2)
    cfg["train"]["model"] = model
    return _pair(f"keras-{model}", f"built-in `{model}` on digits, strategy none, 1 device", cfg, s,
                 note=(f"the `{model}` built-in (`pinpoint.training.loop.models.build_model`, same seed) on both sides; "
                       "digits, sgd, global batch as above. No MFU: the FLOPs count knows Dense layers only."),
                 # run_s: the full run at a8abac4 took 48.8 s (cnn) and 53.2 s (transformer) for 4 runs; +5%.
                 peak=False, run_s={"cnn": 12.8, "transformer": 14.0}.get(model, 14.0))


def _pair_mwm(s: Settings, b2: int) -> Comparison:
    return _pair("keras-mwm", "multi_worker_mirrored, 2 local workers (chief + 1 worker, 1 device each)",
              # Half the steps: a step across two processes takes several times longer.
              bench_config("bench-mwm", strategy="multi_worker_mirrored", devices=1, workers=1,
                           steps=max(s.steps // 2, 2 * s.warmup_steps), batch=b2), s,
              run_s=12.7)  # the full run at a8abac4: 48.3 s for 4 runs; +5%


# Issue 25.5: models users train (keras.applications, no weights, 32x32 RGB) as user code.
REAL_MODELS = (("mobilenetv2", "MobileNetV2"), ("resnet50", "ResNet50"))
REAL_PER_REPLICA_BATCH = 8
REAL_KERAS_STEPS, REAL_KERAS_WARMUP, REAL_KERAS_BATCH = 120, 40, 32


def real_model_config(name: str, model: str, *, devices: int, steps: int, batch: int,
                      strategy: str = "mirrored") -> dict:
    """The demo config (optimizer, learning rate, input on the host) with a keras.applications
    model on random 32x32 RGB images (benchmarks/real_models.py, as the user's code)."""
    cfg = bench_config(name, strategy=strategy, devices=devices, steps=steps, batch=batch)
    cfg["train"].update(model=f"real_models:{model}", data="real_models:images", num_classes=10,
                        code_dir=str(ROOT / "benchmarks"), learning_rate=0.01, log_every=10)
    cfg["placement"].update(warmup_steps=2, sample_steps=1)
    return cfg


def real_models_comparison(s: Settings) -> Comparison:
    """Capture + analysis of MobileNetV2 and ResNet50 under mirrored on 1, 2 and 4 emulated GPUs:
    ops per step, analysis seconds, placement files' MB, peak memory (one run each)."""
    arms = []
    for model, _ in REAL_MODELS:
        for n in s.scaling_devices:
            if s.gpus and n > s.gpus:
                continue
            cfg = real_model_config(f"bench-{model}-{n}", model, devices=n, steps=4,
                                    batch=REAL_PER_REPLICA_BATCH * n)
            spec = {"kind": "placement_scale", "config": cfg, "warmup_steps": 2, "open_report": n == max(s.scaling_devices)}
            if model == "resnet50" and n == max(s.scaling_devices):
                spec["plan_devices"] = n  # issue 33: the planning time on the ResNet50 capture
            arms.append(Arm(f"{model}-n{n}", f"{model} on {n} device(s)", spec))
    return Comparison(
        key="real-models",
        title=f"placement at scale: MobileNetV2 and ResNet50 under mirrored, {REAL_PER_REPLICA_BATCH} images per replica",
        arms=tuple(arms),
        # One round in the full bench (sizes and ops per step are the same in every run; the
        # growth is read across the device counts), to stay within its 50 minutes.
        repeats=1,
        note="each row: one run (sizes and ops per step are the same in every run); a 4-step run with step 2 "
             "captured",
        # Issue 33: `pinpoint plan`'s work on the largest ResNet50 capture, timed 3 times (pooled).
        ratios=tuple(Ratio(f"ResNet50 on {n} emulated GPUs ({model}-n{n}'s capture): `pinpoint plan` read, search "
                           "and predict, s", f"{model}-n{n}", "", "plan_s", target=targets.target("plan.resnet50_s"), pooled="plan_s_runs")
                     for model, n in (("resnet50", max(s.scaling_devices)),) if not s.gpus or n <= s.gpus),
        run_s=22.9,  # the full bench behind RESULTS.md at ceb6600: 130.9 s for its 6 runs; +5%
    )


def _pair_real_model(s: Settings, out: Path = OUT) -> Comparison:
    cfg = real_model_config("bench-keras-mobilenetv2", "mobilenetv2", devices=2, steps=REAL_KERAS_STEPS,
                            batch=REAL_KERAS_BATCH)
    cfg["train"]["checkpoint_every"] = 0
    pair = _pair(
        "keras-mobilenetv2", "MobileNetV2 (keras.applications, no weights, 32x32 RGB), mirrored, 2 logical devices",
        cfg, dataclasses.replace(s, warmup_steps=REAL_KERAS_WARMUP),
        note=(f"the first compute-bound row: MobileNetV2 built by the same callable (`benchmarks/real_models.py`) on "
              f"both sides, random 32x32 RGB images, sgd at {cfg['train']['learning_rate']}, global batch "
              f"{REAL_KERAS_BATCH}, {REAL_KERAS_STEPS} steps, steady state after step {REAL_KERAS_WARMUP}; XLA off "
              "on both sides (a user model); placement capture on (Pinpoint)."),
        peak=False,
        run_s=24.6,  # the full bench behind RESULTS.md at ceb6600: 140.4 s for its 6 runs; +5%
    )
    # Issue 34.2: tracking on/off on a compute-bound model: the same Pinpoint run, tracked to a
    # local store (the sender sends while MobileNetV2 trains).
    tracked = copy.deepcopy(cfg)
    tracked["name"] = "bench-keras-mobilenetv2-tracked"
    tracked["tracking"].update(enabled=True, uri=f"sqlite:///{(out.resolve() / 'tracking-mnv2' / 'mlflow.db')}",
                               log_model=False)
    arms = pair.arms + (dataclasses.replace(pair.arms[0], name="pinpoint-tracked", label="pinpoint train, tracked",
                                            spec=dict(pair.arms[0].spec, config=tracked)),)
    ratios = pair.ratios + (
        Ratio("tracking (local store) steady ex/s on / off", "pinpoint-tracked", "pinpoint", "examples_per_sec",
              targets.target("tracking.steady")),
        Ratio("sender process CPU, steady share of one core (second half of training)", "pinpoint-tracked", "",
              "sender_steady_share", targets.target("tracking.sender_share")),
        Ratio("sender process CPU, share of one core from the run's creation on", "pinpoint-tracked", "",
              "sender_cpu_share"))
    return dataclasses.replace(pair, arms=arms, ratios=ratios, repeats=2)  # a compute-bound run is long: 2 rounds


def build_plan(s: Settings, out: Path = OUT) -> list[Comparison]:
    """Every comparison of every registered section (benchmarks/sections/), in run order."""
    from benchmarks.sections import sections

    return [dataclasses.replace(c, section=sec.key) for sec in sections() for c in sec.build(s, out)]


def keras_comparisons(s: Settings, out: Path) -> list[Comparison]:
    """Pinpoint against Keras `fit`: the issue targets (3.8) first, so a stopped run has them."""
    b2 = 2 * s.per_replica_batch
    need2 = "needs 2 GPUs; this machine has 1" if s.gpus == 1 else ""
    return [
        # 4x the steps: at ~0.38 ms a step, the others' steady window (steps after warm-up) is
        # ~0.7 s, and this row's rounds spread 0.78-1.05 with it (issue 34.3).
        _pair("keras-none", "strategy none, 1 device",
              bench_config("bench-none", strategy="none", devices=1, steps=4 * s.steps, batch=b2), s, run_s=10.0,
              note=f"{4 * s.steps} steps a run (4x the others: a steady window of seconds, not ~0.7 s)."),
        _pair("keras-mirrored", "mirrored, 2 logical devices",
              bench_config("bench-mirrored", strategy="mirrored", devices=2, steps=s.steps, batch=b2), s,
              # 1.7x its target in every run so far: three rounds decide it, the time goes to
              # the rows whose intervals straddle theirs.
              # run_s: the full run at a8abac4 took 47.9 s for its 6 runs; +5%.
              skipped=need2, run_s=8.4, repeats=min(3, s.repeats)),
        _pair_mwm(s, b2),
        _pair_user_model(s, b2, out),
        *(_pair_builtin(s, b2, name) for name in ("cnn", "transformer")),
        loop_anatomy(s, b2),
    ]


# (variant, what it changes, "former": Pinpoint's former choice put back | "keras": one of Keras'
# choices taken | "peer": Keras' whole train function). A former choice slower by its interval is
# what leaving it saved; a Keras choice faster by its interval is part of the gap; the peer says
# whether the training functions themselves differ, call by call.
ANATOMY = (("shuffle_in_step", "the examples chosen inside the step (RandomIndexShuffle per example, Pinpoint's "
            "former order)", "former"),
           ("update_in_xla", "the optimizer's update compiled with forward and backward (as Keras' XLA train step)",
            "keras"),
           ("input_on_device", "the batch gathered on the device, the loop in one partition (as Keras' "
            "distributed dataset prefetches it there)", "keras"),
           ("keras", "Keras' own train function (the multi-step function `fit` runs, on its tf.data input)", "peer"))


def loop_anatomy(s: Settings, b2: int) -> Comparison:
    """Issue 34.4: the strategy-none row against variants of Pinpoint's training function, each
    with one choice changed, in one process (benchmarks/loop_anatomy.py): speed over Pinpoint's."""
    cfg = bench_config("bench-anatomy", strategy="none", devices=1, steps=s.steps, batch=b2, placement=False)
    arm = "anatomy"
    return Comparison(
        key="loop-anatomy",
        title="strategy none, 1 device: Pinpoint's training function against itself with one choice changed",
        arms=(Arm(arm, "training function variants", {"kind": "loop_anatomy", "config": cfg,
                                                        "scale": 1.0 if s.steps >= 1000 else 0.1}),),
        ratios=tuple(Ratio(f"{label}: variant / Pinpoint examples/sec", arm, "", f"{key}_speedup",
                           pooled=f"{key}_speedup_blocks") for key, label, _kind in ANATOMY),
        repeats=1,
        run_s=60.0,  # measured: 65.2 s with 10 rounds of 150 pairs of calls (4 variants); 130 pairs here
    )


def overhead_comparison(s: Settings) -> Comparison:
    """Issue 4.6: the demo config (checkpoints every 100 steps) for 500 steps, capture on/off."""
    b2 = 2 * s.per_replica_batch
    need2 = "needs 2 GPUs; this machine has 1" if s.gpus == 1 else ""

    def overhead(name, placement, tracking, timing=False):
        cfg = bench_config(f"bench-{name}", strategy="mirrored", devices=2, steps=s.overhead_steps,
                           batch=b2, placement=placement, tracking=tracking, checkpoint_every=100)
        if timing:  # placement.timing: the sampled steps under TensorFlow's profiler
            cfg["placement"]["timing"] = True
        return Arm(name, name.replace("-", " "), {"kind": "pinpoint", "config": cfg,
                                                 "warmup_steps": min(s.warmup_steps, s.overhead_steps // 2),
                                                 "peak": tracking, "log_mfu": tracking},
                   max_rounds=s.repeats if tracking or timing else None)
    return Comparison(
        key="overhead",
        title=f"placement capture and timing, {s.overhead_steps}-step mirrored runs",
        arms=(overhead("capture-on", True, False), overhead("baseline", False, False),
              overhead("timing-on", True, False, timing=True)),
        ratios=(
            # A steady cost as a ratio of steady rates, the one-off cost as seconds (issue 50.2).
            Ratio("capture on / off, steady ex/s", "capture-on", "baseline", "examples_per_sec",
                  targets.target("capture.steady")),
            Ratio("capture on - off, fixed cost: train time (s)", "capture-on", "baseline", "train_s",
                  targets.target("capture.fixed_s"), difference=True),
            Ratio("timing on / off, train time", "timing-on", "baseline", "train_s"),  # recorded, no target
        ),
        note="baseline: capture off, MLflow off; capture on turns capture on; timing on: "
             "capture on and placement.timing on (the sampled steps under TensorFlow's profiler)",
        skipped=need2,
        repeats=s.repeats * s.overhead_repeat_factor,
        run_s=6.4,  # the full run at a8abac4: 151.4 s for its 25 runs; +5%
    )


def scaling_comparison(s: Settings) -> Comparison:
    need2 = "needs 2 GPUs; this machine has 1" if s.gpus == 1 else ""
    arms = []
    for n in s.scaling_devices:
        if s.gpus and n > s.gpus:
            continue
        cfg = bench_config(f"bench-scale-{n}", strategy="mirrored", devices=n, steps=s.steps,
                           batch=s.per_replica_batch * n)
        reuse = ("keras-mirrored", "pinpoint") if n == 2 and not need2 else None
        arms.append(Arm(f"n{n}", f"{n} device(s)", {"kind": "pinpoint", "config": cfg,
                                                    "warmup_steps": s.warmup_steps, "peak": True}, reuse=reuse))
    return Comparison(
        key="scaling",
        title=f"mirrored on 1, 2, 4 devices, {s.per_replica_batch} examples per replica",
        arms=tuple(arms),
        skipped="" if len(arms) > 1 else "needs at least 2 devices",
        run_s=8.5,
    )


def make_run_comparison(s: Settings) -> Comparison:
    return Comparison(
        key="make-run",
        title="`make run` (pinpoint run configs/demo.yaml through kfp.local)",
        arms=(Arm("make-run", "make run", {"kind": "make_run", "config_path": str(DEMO)}),),
        ratios=(Ratio("wall time s", "make-run", "", "wall_s", targets.target("make_run.wall_s")),),
        repeats=s.make_run_repeats,
        run_s=18.0,
    )


def tracking_comparison(s: Settings, b2: int, out: Path) -> Comparison:
    """Issue 15.4: what MLflow tracking costs a demo run (mirrored on 2 devices, checkpoints every
    100 steps, placement capture on as by default), with a local sqlite store and with a real
    `mlflow server` over HTTP, and the final model's export (local store). Issue 34.2: runs of
    TRACKING_STEPS_FACTOR x steps (a steady window of several seconds, the sender sending through it), the
    sender process's CPU share of one core while it sends and the training's µs per logging call,
    from the run's tracking.json."""

    def arm(name: str, label: str, uri: str | None, log_model: bool = False, mfu: bool = False) -> Arm:
        cfg = bench_config(f"bench-trk-{name}", strategy="mirrored", devices=2, steps=s.steps,
                           batch=b2, tracking=uri is not None, checkpoint_every=100)
        if uri is not None:
            cfg["tracking"].update(uri=uri, log_model=log_model)
        # mfu: after the clock stops, the matmul peak is measured and MFU logged into the run.
        return Arm(name, label, {"kind": "pinpoint", "config": cfg, "peak": mfu, "log_mfu": mfu,
                                 "warmup_steps": s.warmup_steps})

    store = f"sqlite:///{(out.resolve() / 'tracking' / 'mlruns' / 'mlflow.db')}"
    steps = s.steps * TRACKING_STEPS_FACTOR
    s = dataclasses.replace(s, steps=steps)
    return Comparison(
        key="tracking",
        title=f"MLflow tracking, {steps}-step demo runs (mirrored, 2 devices)",
        arms=(arm("off", "tracking off", None),
              arm("local", "local store, no model", store),
              arm("local-model", "local store, with the model", store, log_model=True, mfu=True),
              arm("server", "mlflow server, no model", SERVER_URI)),
        ratios=(
            Ratio("local store: steady ex/s on / off", "local", "off", "examples_per_sec", targets.target("tracking.steady")),
            Ratio("local store: fixed cost, train time on - off (s)", "local", "off", "train_s", targets.target("tracking.fixed_s"),
                  difference=True),
            Ratio("local store: model export, train time with - without the model (s)", "local-model", "local",
                  "train_s", difference=True),
            Ratio("mlflow server: steady ex/s on / off", "server", "off", "examples_per_sec", targets.target("tracking.steady")),
            Ratio("mlflow server: fixed cost, train time on - off (s)", "server", "off", "train_s", targets.target("tracking.fixed_s"),
                  difference=True),
            Ratio("local store: sender process CPU, steady share of one core (second half)", "local", "",
                  "sender_steady_share", targets.target("tracking.sender_share")),
            Ratio("mlflow server: sender process CPU, steady share of one core (second half)", "server", "",
                  "sender_steady_share", targets.target("tracking.sender_share")),
            Ratio("local store: sender process CPU, share of one core from the run's creation on", "local", "",
                  "sender_cpu_share"),
            Ratio("mlflow server: sender process CPU, share of one core from the run's creation on", "server", "",
                  "sender_cpu_share"),
            Ratio("local store: training's logging path, µs per step-metrics call", "local", "", "log_us_per_call"),
            Ratio("mlflow server: training's logging path, µs per step-metrics call", "server", "",
                  "log_us_per_call"),
        ),
        note=("train time: `train_command` with TensorFlow imported, as in the capture rows. As `pinpoint train` "
              "does, the worker starts the MLflow sender process before importing TensorFlow (MLflow's import and "
              "the store's opening run on the other core meanwhile); the process wall difference includes "
              "whatever of that is not hidden. Model export: the extra train time of logging the final model, "
              "which the end of the step waits for."),
        mlflow_server=True,
        run_s=8.9,  # the full run at a8abac4: 183.9 s, 15 s of it the server's setup, for 20 runs; +5%
        # The sender's steady share is bursty (a pass sends the checkpoints of the second before:
        # 0 to 0.025 over five runs): rounds past 5 while an interval is wide, about 8 in all.
        time_cap_s=8 * 4 * 7.9 if s.repeats >= 3 else None,  # --quick checks the harness: its rounds only
        setup_s=15.0,  # the server's start, the store's tables
        # The local store exists before the first round, as after a user's first run (creating
        # its tables takes seconds once; opening it, ~1 s each time, is in every arm's figure).
        prepare=Prepare(("-c", "import sys; from mlflow.tracking import MlflowClient; "
                         "MlflowClient(sys.argv[1]).search_experiments()", store)),
    )


ALL_REDUCE_RUNNABLE = ("ring", "reduce_to_host", "hierarchical_copy")  # here; nccl needs real GPUs


def allreduce_comparison(s: Settings) -> Comparison:
    """Issue 15.6: train.all_reduce, each choice that runs on this machine, mirrored on the scaling
    comparison's multi-device counts (same config otherwise). The choice `auto` makes on this
    machine (ring among emulated GPUs, NCCL among real ones) reuses the scaling arm's runs."""
    choices = ALL_REDUCE_RUNNABLE + (("nccl",) if s.gpus else ())
    auto = "nccl" if s.gpus else "ring"
    arms = []
    for n in s.scaling_devices:
        if n < 2 or (s.gpus and n > s.gpus):
            continue
        # hierarchical_copy is refused for an odd device count (it reduces two equal halves).
        for choice in (c for c in choices if not (c == "hierarchical_copy" and n % 2)):
            cfg = bench_config(f"bench-ar-{choice.replace('_', '-')}-{n}", strategy="mirrored", devices=n,
                               steps=s.steps, batch=s.per_replica_batch * n)
            cfg["train"]["all_reduce"] = choice
            if choice == "nccl":
                cfg["cluster"]["emulate"] = False  # refused under emulation; the real GPUs run either way
            arms.append(Arm(f"{choice}-n{n}", f"{choice}, {n} devices",
                            {"kind": "pinpoint", "config": cfg, "warmup_steps": s.warmup_steps, "peak": False},
                            reuse=("scaling", f"n{n}") if choice == auto else None))
    return Comparison(
        key="allreduce",
        title=f"train.all_reduce: mirrored, {s.per_replica_batch} examples per replica",
        arms=tuple(arms),
        note=(f"{auto} is what `auto` does here: its rows are the scaling runs. "
              + ("" if s.gpus else "nccl is not run: it needs real GPUs (refused at config load under emulation); ")
              + "hierarchical_copy needs an even device count (refused otherwise)."),
        skipped="" if arms else "needs at least 2 devices",
        run_s=5.8,  # the full bench behind RESULTS.md at ceb6600: 109.2 s for 20 runs; +5%
    )
