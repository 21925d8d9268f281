"""Judge a program's weights against the device requests it made for them: one conformance rule
per requested device ("tf.device /GPU:1: weights"), each weight requested there (when it, its
layer or an enclosing model was created or built under the scope, or its layer was called under
it) against the device the weight lives on. A violation names the layer, the variable, the
request and where the weight is; a layer whose weights Keras 3 created lazily, outside the scope
it was created or built in, gets the explain entry `lazy_build`."""

from __future__ import annotations

from collections import Counter, defaultdict

from pinpoint.device_names import DeviceMap, matches, sort_key

LAZY = ("layer created", "layer built", "declared")


EXPLAIN = {
    "weight_requests": "Rules 'tf.device X: weights': the weights (Keras variables) the program requested on X "
    "(created, or their layer or model created or built, inside its tf.device X scope; or their layer called "
    "there), against the device each weight lives on. A weight read or updated under a request for another "
    "device is a violation too: every call copies it across.",
}


LAZY_BUILD = (
    "Keras 3 builds layers lazily. Creating a layer inside tf.device creates no weights, and neither does "
    "build(shape) on a subclassed model without a build method: the weights are created at the first call. A "
    "subclassed model's first call builds its layers in a symbolic run whose weights are only declared, and "
    "TensorFlow creates them afterwards outside every scope of call(), on the default device (/GPU:0 on a GPU "
    "machine), even for layers called inside tf.device. The layer's ops may still run where they were requested, "
    "reading their weights across devices each step. Fix: build each layer inside its scope before the model's "
    "first call, e.g. in __init__: `with tf.device('/GPU:1'): self.dense = Dense(16); "
    "self.dense.build((None, 8))` (or call the layer once on a batch there)."
)


def _why(row: dict, actual: str) -> str:
    how, req, by = row["how"], row["requested"], row.get("by") or row["layer"]
    fix = "build the layer inside the scope (layer.build(shape) or one call there); see explain.lazy_build"
    if how == "declared":
        return (f"declared under tf.device {req} in Keras' symbolic build, created later outside the scope on "
                f"{actual} (Keras 3 lazy build): {fix}")
    if how in LAZY:
        what = "created" if how == "layer created" else "built"
        return (f"{by} {what} under tf.device {req}, its weights created later at the first call outside the "
                f"scope, on {actual} (Keras 3 lazy build): {fix}")
    if how == "layer called":
        return f"layer called under tf.device {req} with its weights on {actual}: each call reads them across devices"
    return f"created under tf.device {req}, placed on {actual} (soft placement)"


def weight_rules(rows: list[dict], namer: DeviceMap) -> tuple[list[dict], dict]:
    """(conformance rules, explain entries) from `trace.requests.RequestLog.rows()`."""
    spec = namer.canonical_spec
    by_device: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_device[spec(r["requested"])].append(r)
    rules, lazy = [], False
    for dev in sorted(by_device, key=sort_key):
        rel = by_device[dev]
        placed = [spec(r["actual"]) for r in rel]
        bad = []
        for r, where in zip(rel, placed):
            if matches(dev, where):
                continue
            lazy |= r["how"] in LAZY
            bad.append({"op": f"{r['layer']}/{r['variable']}" if r["layer"] else r["variable"],
                        "layer": r["layer"], "variable": r["variable"], "requested": dev, "placed": where,
                        "how": r["how"], "why": _why(dict(r, requested=dev), where)})
        observed = Counter(placed)
        rules.append({"rule": f"tf.device {dev}: weights", "planned": dev,
                      "observed": {d: observed[d] for d in sorted(observed, key=sort_key)},
                      "relevant": len(rel), "score": round((len(rel) - len(bad)) / len(rel), 4),
                      "violations": bad[:50], "violations_total": len(bad)})
    explain = dict(EXPLAIN) if rules else {}
    if lazy:
        explain["lazy_build"] = LAZY_BUILD
    return rules, explain


def weight_lines(rules) -> list[str]:
    """The summary's line for weights not where the program requested them (`rules`: the model's)."""
    bad = [v for r in rules if r.rule.endswith(": weights") for v in r.violations]
    if not bad:
        return []
    v = bad[0]
    more = f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""
    lazy = " - Keras lazy build, see report" if v.how in LAZY else ""
    return [f"weights    : {len(bad)} not where requested: {v.op} requested {v.requested} ({v.how}), "
            f"on {v.placed}{lazy}{more}"]
