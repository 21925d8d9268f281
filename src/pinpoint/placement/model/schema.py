"""The placement.json format: its schema version, the text explaining each field, and how its
counts and per-step means are written."""

from __future__ import annotations

# 2: the typed model (placement.model); adds `layer_pins`. Version 1 reads through model.upgrade.
SCHEMA_VERSION = 2


EXPLAIN = {
    "devices": "Devices that executed at least one op (spec names; with emulation each spec GPU "
    "is a logical CPU device, shown alongside).",
    "ops_by_device": "Ops executed per step on each device, read from the partition graphs the runtime "
    "ran (not from op.device, which is only the request). _Send/_Recv/_Arg/_Retval are not counted.",
    "transfers": "Every edge between ops on different devices becomes a _Send/_Recv pair; each pair "
    "is one transfer. Bytes = dtype size x shape: the traced shape, an argument's real shape, and for an "
    "input batch with a dynamic batch dimension the bytes the iterator handed out in the captured call. "
    "A transfer that still has no size (a string tensor, a data-dependent shape) is counted, not sized, "
    "and unsized_reasons says why. sizing_errors (written when there are any) names each function and op "
    "at which TensorFlow's shape inference over the executed graphs failed or contradicted the traced graph. "
    "The trainer's multi-step loop "
    "also sends its predicate and a control signal to each device every step: counted apart as "
    "loop_control.",
    "collectives": "Collective ops (all-reduce, all-gather) exchange data between replicas through "
    "their own channels (rings, NCCL, gRPC), not through _Send/_Recv; counted per device with the size of "
    "the tensor each one reduces.",
    "fallbacks": "An op whose requested device differs from the device it ran on: with soft placement "
    "the placer moves an op when the requested device does not exist, has no kernel for the op, or the op "
    "must be colocated with a resource (variable) on another device. Under GPU emulation an op that ran on "
    "an emulated GPU but has no GPU kernel for its dtypes (TensorFlow's kernel registry) is listed as "
    "predicted: a GPU machine would run it on the host.",
    "variables": "Where each variable lives (every mirrored component; central storage on the host; "
    "parameter-server tasks) and where its update ops (assign/apply) ran. An update always runs on the "
    "variable's device; its input is copied there first. Class 'internal': TensorFlow's own variables "
    "(a strategy's collective-ordering tokens), shown apart and never counted as the program's. A traced "
    "program's variable has `created`: the tf.distribute strategy in scope when it was created, the "
    "tf.device request it was made under, and the Keras scope (`layer`) or the program's line (`source`) "
    "that made it. `freed`: created, then gone before the program ended (and never used by a captured "
    "function): its row is what was read at its creation, left out of the counts of the program's "
    "variables at the end.",
    "gradients": "Backward-pass ops (name scopes 'gradients/' and 'gradient_tape/') per device.",
    "replica_consistency": "Largest absolute difference between the components of each mirrored "
    "variable at the end of training, split by what the strategy promises for it. Trainable drift "
    "(trainable weights, optimizer slots, aggregated state) must be 0: anything else is a broken "
    "all-reduce. State drift (non-trainable state assigned inside each replica, such as "
    "BatchNormalization's moving statistics) is expected: each replica keeps "
    "the statistics of its own share of the batch, and a checkpoint keeps the first replica's. ON_READ "
    "variables (Keras' metric accumulators) differ on each replica by design and are summed or averaged "
    "when read: their drift is on_read_drift, not part of state drift.",
    "layer_pins": "train.pinning.layers resolved against the built model: every pinned layer's path and the "
    "device its key pins it to (the layers each layers.<key> rule and row cover).",
    "conformance": "Each pinning rule: planned device versus the devices the relevant ops really ran "
    "on (a predicted fallback counts where a GPU machine would run it). Score = fraction of relevant ops "
    "on the planned device.",
    "timing": "placement.timing: the sampled steps ran as one call under TensorFlow's profiler; each "
    "kernel event of the trace is attributed to its device through the partition graphs. busy = union of "
    "the device's op intervals (ops overlap on the inter-op threads; work nested inside an op's event, "
    "such as a receiving device's kernels run by a _Send's callback, is not the op's); transfer = union "
    "of its _Send/_Recv and collective intervals (a collective includes waiting for its peers; a receive's "
    "wait for its producer is not counted); compute = busy - transfer; idle_share = 1 - busy / wall, wall "
    "= first op start to last op end of the call. Wall-clock times: with emulation the devices share the "
    "host's cores.",
    "memory": "placement.memory / pinpoint trace --memory: every allocation TensorFlow's allocator made "
    "during one profiled call (TF_CPU_ALLOCATOR_USE_BFC=true makes the profiler record each one), "
    "attributed to the device of the op that made it. Peak = the most bytes live at once on the device; "
    "requested is what the ops asked for, allocated what the allocator handed out (a fits verdict needs "
    "allocated). Logical CPU devices share a received tensor's buffer where a GPU copies it, so an emulated "
    "device can hold less than the GPU would (docs/memory.md). A task of a multi-process cluster runs no "
    "profiler (it can crash the task): task_peak is then its allocator's own peak over the same steps, every "
    "device of the task together.",
}


# A traced program's own sections (pinpoint trace, train.entrypoint).
EXPLAIN_TRACE = {
    "functions": "Every tf.function (and tf.compat.v1 Session.run signature) the program ran: calls, and per "
    "call the ops per device, transfers and their bytes, from the partition graphs of its first call (every "
    "later call runs the same graphs). The training function (it updates variables; Keras' train function "
    "first) is the one the ops, transfers and conformance sections describe.",
    "eager": "Ops the program ran eagerly, outside any function: the device each one ran on (its outputs'; an "
    "op that writes a variable runs on the variable's device), and every input the eager runtime copied to "
    "that device first (source -> destination, bytes).",
    "conformance_trace": "Rules 'tf.device X': the ops of the training function that the program's own "
    "device scopes (or its strategy) requested on X, against where they ran.",
}


def json_number(x: float):
    """A count or a mean as placement.json writes it: an int when whole, else 2 decimals."""
    return int(x) if float(x).is_integer() else round(float(x), 2)
