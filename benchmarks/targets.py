"""Every target of benchmarks/RESULTS.md, declared once (issue 50.2).

A target is decided only by the 95% interval of its median over at least 3 values
(benchmarks.stats.MIN_VALUES: rounds, or pairs of blocks pooled over the rounds): met when all of the interval is on the
target's side, NOT met when none of it is (benchmarks.stats.decide). A figure measured fewer
times is "recorded", never met. A steady cost is a ratio of steady rates (examples/s on / off);
a fixed cost is a difference in seconds (train time on - off), never a ratio of two run times.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    op: str  # "<=" or ">="
    bound: float
    unit: str  # what the bound is in (a ratio of steady rates, seconds of fixed cost, µs per call, ...)
    issue: str  # the issue that set it

    def __str__(self) -> str:
        return f"{self.op} {self.bound:g}"


TARGETS: dict[str, Target] = {
    # Pinpoint against Keras model.fit: steady examples/s, pinpoint / Keras.
    "keras.steady": Target(">=", 1.0, "ratio of steady examples/s", "3.8"),
    # Placement capture on a 500-step mirrored run: its steady rate and its one-off cost.
    "capture.steady": Target(">=", 0.97, "ratio of steady examples/s, capture on / off", "4.6, 50.2"),
    "capture.fixed_s": Target("<=", 0.5, "seconds of train time, capture on - off", "4.6, 50.2"),
    # MLflow tracking.
    "tracking.steady": Target(">=", 0.98, "ratio of steady examples/s, tracking on / off", "15.4"),
    "tracking.fixed_s": Target("<=", 2.0, "seconds of train time, tracking on - off", "15.4"),
    "tracking.sender_share": Target("<=", 0.02, "share of one core, the sender's steady CPU", "34.2"),
    # pinpoint trace against python on the worked examples.
    "trace.steady": Target(">=", 0.97, "ratio of steady examples/s, trace / python", "24.5"),
    "trace.fixed_s": Target("<=", 3.0, "seconds of process wall beyond the steady work, trace - python", "24.5"),
    # Per call, as a user pays it (whole processes) and where it arises (one process).
    "calls.tf_function_us": Target("<=", 2.0, "µs per tf.function call, trace - python", "34.1, 50.5"),
    "calls.eager_op_us": Target("<=", 0.5, "µs per eager op, trace - python", "34.1, 50.5"),
    "calls.log_us": Target("<=", 5.0, "µs per pinpoint.log call into a step run", "34.1"),
    # make run.
    "make_run.wall_s": Target("<=", 30.0, "seconds of wall time", "15.7"),
    # Real models and the planner.
    "plan.resnet50_s": Target("<=", 5.0, "seconds of `pinpoint plan` on the largest ResNet50 capture", "33"),
    "plan_ps.balance": Target("<=", 1.10, "largest ps / mean bytes per step", "33"),
    "plan_ps.plan_s": Target("<=", 5.0, "seconds of planning on the captured graph", "33"),
    "plan_mp.balance": Target("<=", 1.10, "busiest device / mean compute per step", "33"),
    "plan_step.own_error": Target("<=", 0.10, "|predicted - measured| / measured step, own placement", "33"),
    "plan_step.max_error": Target("<=", 0.15, "largest |predicted - measured| / measured step", "33"),
    "plan_step.spearman": Target(">=", 0.8, "Spearman rank correlation, predicted vs measured", "33"),
    "real_models.per_op_spread": Target("<=", 2.0, "analysis µs per op, largest / smallest device count", "25.5"),
    "real_models.report_open_ms": Target("<=", 2000.0, "ms to open report.html in headless Chromium", "25.5"),
    "k8s.provision_s": Target("<=", 10.0, "seconds to provision the largest cluster", "26.7"),
    # Memory per device: placement.memory's cost (issue 49).
    "memory.steady": Target(">=", 0.97, "ratio of steady examples/s, memory on / off", "49"),
    "memory.fixed_s": Target("<=", 2.0, "seconds of train time, memory on - off", "49"),
    "memory.prediction": Target("<=", 0.05, "|predicted - measured| / measured peak, per device", "49"),
    # At 4x the batch: within 10% of the most measured there, and never more than 5% below it (issue 66).
    "memory.at_batch": Target("<=", 0.10, "|predicted at 4x - measured at 4x| / measured at 4x, per device", "66"),
    "memory.at_batch_low": Target("<=", 0.05, "(measured at 4x - predicted at 4x) / measured at 4x, per device", "66"),
}


def target(key: str) -> str:
    """The target as a Ratio states it, e.g. '<= 2'."""
    return str(TARGETS[key])


def bound(key: str) -> float:
    return TARGETS[key].bound
