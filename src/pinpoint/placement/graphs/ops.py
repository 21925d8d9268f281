"""TensorFlow's op vocabulary: every op-name set and pattern the analyses read graphs with, the
NodeDef attrs Pinpoint adds to captured graphs, tensor-name parsing and dtype sizes.

No other module of src/ spells a send's or a receive's op type or a collective's: a rule that
reads graphs takes its set from here, so two analyses cannot disagree about what a send, a
collective or a variable update is. Where two rules need different members for one concept, both
sets are here, side by side, each with the reason it differs (tests/test_ops_vocabulary.py holds the
relations between them).
"""

from __future__ import annotations

import functools
import re

# ---- Pinpoint's own NodeDef attrs on captured graphs (no TensorFlow op has them) -----------------

# On the per-step view (placement.graphs.steps): a _Send of the training loop's own predicate or
# control signal.
LOOP_ATTR = "_pinpoint_loop_control"
# On ops that GPU emulation placed on the emulated /GPU:0 (no device request of the user's: a GPU
# machine's placer would have put them there), see pinpoint.distribute.emulation.
EMULATED_ATTR = "_pinpoint_emulated"
# On ops expanded from an XLA-compiled call (XLA, not the kernel registry, runs them).
XLA_ATTR = "_pinpoint_xla"

# ---- a cross-device edge's two ends, and a function's boundary ---------------------------------

SENDS = frozenset({"_Send", "_HostSend"})
RECVS = frozenset({"_Recv", "_HostRecv"})
TRANSPORT = SENDS | RECVS
ARGS = frozenset({"_Arg", "_DeviceArg"})
RETVALS = frozenset({"_Retval", "_DeviceRetval"})
# Bookkeeping nodes: how data moves between partitions and in and out of a function. Not "ops that
# ran" for counting (transfers are counted apart, from the _Send side).
BOUNDARY = ARGS | RETVALS
BOOKKEEPING = TRANSPORT | BOUNDARY
# What conformance and the planner leave out of "where the compute ran".
NOT_COMPUTE = BOOKKEEPING | {"Const", "NoOp"}
# Ops that make no buffer a kernel allocates when the memory replay runs them: constants (made when
# the graph is built), arguments, handles, no-ops.
NOTHING_MADE = frozenset({"Const", "HostConst", "VarHandleOp", "NoOp", "ControlTrigger"}) | ARGS
# The function-call ops whose body XLA or emulation may expand (a call's body runs as the call).
CALLS = frozenset({"StatefulPartitionedCall", "PartitionedCall"})
# Ops that give a kernel the step's state (a variable's value, a constant, an argument), ready from
# the call's start whatever the step computes.
STATE_SOURCES = frozenset({"ReadVariableOp", "Identity"}) | NOTHING_MADE

# ---- collectives -----------------------------------------------------------------------------

# Every collective and NCCL op: time spent in one is transfer time (analysis.timing), memory it
# holds is the collective's (memory.measured).
COLLECTIVE_RE = re.compile(r"^(Collective\w+|Nccl\w+|_Nccl\w+)$")
# The traffic of a collective, each exchange counted once: every Collective* op, and of NCCL's only
# the all-reduce and the sending half of a reduce or broadcast (its receiving half carries the same
# bytes back).
COLLECTIVE_TRAFFIC_RE = re.compile(r"^(Collective\w+|NcclAllReduce|_NcclReduceSend|_NcclBroadcastSend)$")
# Collectives whose output is a new buffer the size of their input, made while the op runs (the
# memory replay gives them their chunk): reduce, gather, all-to-all. A broadcast's receiver and
# NCCL's send/receive halves are left to the general rules.
REDUCING_COLLECTIVE_RE = re.compile(r"^(Collective(Reduce|Gather|AllToAll)\w*|NcclAllReduce)$")
# NCCL's all-reduce: the planner's sign that a mirrored run reduced with NCCL.
NCCL_ALL_REDUCE = "NcclAllReduce"
# The ring all-reduce's ops (CollectiveReduceV2 and its kin).
RING_COLLECTIVE_RE = re.compile(r"^Collective")
# The allocator's name for a collective's ring buffer (an allocation event's `tf_op`, not an op).
COLLECTIVE_CHUNK = "CollectiveAdapterImpl::TempChunk"

# ---- the input pipeline ----------------------------------------------------------------------

ITERATOR_GET_NEXT = frozenset({"IteratorGetNext", "IteratorGetNextSync"})
# The ops that hand out an input element and declare its `output_shapes` (what shape inference and
# the batch scaling read).
INPUT_SOURCES = ITERATOR_GET_NEXT | {"OptionalGetValue"}
# An element on an accelerator is made by its distributed iterator's prefetch before the call, not
# by this kernel: the replay and the eager view add a multi-device iterator's shard read.
PREFETCHED = INPUT_SOURCES | {"MultiDeviceIteratorGetNextFromShard"}
# The ops whose allocations the measured memory calls "input": IteratorGetNextAsOptional allocates
# the element it wraps (a shard read's element was allocated on tf.data's threads, with no op).
INPUT_ALLOCATORS = INPUT_SOURCES | {"IteratorGetNextAsOptional"}
# Every op of the input pipeline, matched on the op type (conformance's "input" rule, the planner's
# input group): iterators, optionals and the dataset ops themselves.
INPUT_RE = re.compile(r"(IteratorGetNext\w*|MultiDeviceIterator\w*|OptionalGetValue|OptionalHasValue|\w*Dataset(V\d)?)$")

# ---- variable updates ------------------------------------------------------------------------

# Every op that writes into a resource variable: dense and sparse optimizer applies, scatters and
# assignments.
UPDATE_RE = re.compile(r"^(Assign(Add|Sub)?VariableOp|ResourceApply\w+|ResourceSparseApply\w+|ResourceScatter\w+)$")
# The dense updates: each writes a copy of its variable when a read still holds the buffer, or
# always once the variable is in copy-on-read mode (training_op_helpers.h, PrepareToUpdateVariable).
DENSE_UPDATE_RE = re.compile(r"^(Assign(Add|Sub)?VariableOp|ResourceApply\w+)$")
# The sparse updates: scatters and sparse optimizer applies, written in place once the variable is in
# copy-on-read mode.
SPARSE_UPDATE_RE = re.compile(r"^(ResourceSparseApply\w+|ResourceScatter\w+)$")
# The ops that put a variable in copy-on-read mode (EnsureSparseVariableAccess): the sparse updates and
# the gathers. The first one copies the variable if a read still holds it; from then on every
# ReadVariableOp of it copies the whole variable (resource_variable_ops.cc, CopyVariable), which is
# what an embedding table read by `tf.gather` and updated by a scatter costs.
SPARSE_ACCESS_RE = re.compile(r"^(ResourceGather(Nd)?|ResourceSparseApply\w+|ResourceScatter\w+)$")

# ---- kernels that may run at once --------------------------------------------------------------

# A convolution's input and filter gradients: both read the same gradient, so the executor may run
# them at once, each holding its workspace (memory.overlap).
CONV_GRADIENT_RE = re.compile(r"^(Conv[23]D|DepthwiseConv2dNative)Backprop(Input|Filter)(V2)?$")

# ---- control flow and ops that pass an input on ----------------------------------------------

MERGES = frozenset({"Merge", "RefMerge"})
SWITCHES = frozenset({"Switch", "RefSwitch"})
ENTERS = frozenset({"Enter", "RefEnter"})
EXITS = frozenset({"Exit", "RefExit"})
NEXT_ITERATIONS = frozenset({"NextIteration", "RefNextIteration"})
# A while loop's frame, lowered: what enters, leaves and goes round it, and its condition.
LOOP_FRAME = ENTERS | EXITS | NEXT_ITERATIONS | {"LoopCond"}
CONTROL_FLOW = LOOP_FRAME | MERGES | SWITCHES
# Ops whose first input is their output, followed when resolving a resource handle back to its
# variable through a lowered cond or loop (a Merge is followed through whichever input ran).
HANDLE_FORWARD = frozenset({"Identity", "_SwitchN"}) | SWITCHES | ENTERS | EXITS | NEXT_ITERATIONS
# The handle-passing ops the memory replay follows back to a variable: one step of a loop's body
# is replayed, so a NextIteration is not; a Merge's first input is the value entering.
REPLAY_HANDLE_PASS = frozenset({"Identity", "Merge", "Exit"}) | ENTERS | SWITCHES
# Ops followed (first input) when the per-step view rewires inputs past the loop's machinery: a
# loop-invariant input travels Enter -> Merge -> Switch -> Identity.
STEP_FORWARD = frozenset({"Identity"}) | ENTERS | MERGES | SWITCHES
# Ops that pass a tensor on unchanged, followed when a round trip is traced back to its source.
PASS_ON = frozenset({"Identity", "IdentityN", "Snapshot"}) | MERGES | SWITCHES
# Ops whose output is their input's value (what a requested input is followed through).
IDENTITIES = frozenset({"Identity", "IdentityN", "Snapshot"})
# Ops whose output is a view of their first input's buffer (the memory replay allocates nothing).
ALIASES_FIRST_INPUT = (frozenset({"Identity", "Reshape", "Squeeze", "ExpandDims", "StopGradient", "PreventGradient",
                                  "EnsureShape"}) | ENTERS | EXITS | NEXT_ITERATIONS | SWITCHES | RETVALS)

# ---- shapes and element-wise ops -------------------------------------------------------------

# Ops whose one output has the shape of each of their data inputs. A node the graph optimizer made
# has no traced shape (ArithmeticOptimizer's AddOpsRewrite_AddN merges hierarchical_copy's
# AddN(AddN(a, b), c) into one), but its inputs have one.
SAME_SHAPE = frozenset({"AddN", "Identity", "Snapshot"})
# Element-wise binary ops: their output has the broadcast shape of their two inputs. Grappler's
# ArithmeticOptimizer rewrites a residual block's Add into nodes of its own (AddOpsRewrite_Add)
# that have no traced shape; their inputs do.
BROADCAST = frozenset({"Add", "AddV2", "Sub", "Mul", "Maximum", "Minimum", "RealDiv"})
# The binary ops Grappler re-associates (a chain of them may come out in another order).
REASSOCIATED = frozenset({"Mul", "Add", "AddV2"})
# Element-wise ops: the kernel may write its output into its first input's buffer when that input
# has no other reader (TensorFlow's forward_input), which the memory replay follows.
CWISE = frozenset({"Relu", "Relu6", "Elu", "Selu", "LeakyRelu", "Tanh", "Sigmoid", "Softplus", "Exp", "Log", "Log1p",
                   "Neg", "Square", "Sqrt", "Rsqrt", "Abs", "Sign", "Reciprocal", "Div", "DivNoNan", "Pow",
                   "SquaredDifference", "ReluGrad", "Relu6Grad", "EluGrad", "SeluGrad", "LeakyReluGrad", "TanhGrad",
                   "SigmoidGrad", "SqrtGrad", "RsqrtGrad", "SoftplusGrad", "BiasAdd", "AddN", "Snapshot", "Floor",
                   "Ceil", "Round", "Erf", "Cos", "Sin", "ClipByValue", "Select", "SelectV2"}) | BROADCAST
# A hash table's lookups (shape inference reads their result as a fill of the default value).
LOOKUPS = frozenset({"LookupTableFindV2", "LookupTableFind"})

# ---- tensor lists ----------------------------------------------------------------------------

LIST_OPS = frozenset({"TensorListPushBack", "TensorListPopBack", "TensorListFromTensor"})
# Ops whose allocator `temp` requests are a list's elements, not a kernel's scratch (list_kernels.h:
# TensorListFromTensor copies each element into its own allocate_temp buffer, which the list keeps).
LIST_MAKERS = frozenset({"TensorListFromTensor", "TensorListSplit", "TensorListScatter", "TensorListScatterV2",
                         "TensorListScatterIntoExistingList"})

# Ops whose outputs are not a new buffer of their own (an input passed on, a variable's, a list's element).
NOT_MADE = ALIASES_FIRST_INPUT | MERGES | NOTHING_MADE | SENDS | RECVS | PREFETCHED | LIST_OPS | {
    "IdentityN", "ReadVariableOp", "TensorListGetItem"}

# ---- oneDNN ----------------------------------------------------------------------------------

# The prefix oneDNN's graph rewrite gives the ops it takes over on the CPU (_MklConv2D,
# _MklNativeFusedMatMul): stripped, the op is TensorFlow's own.
MKL_PREFIX = re.compile(r"^_Mkl(?:Native)?(?=[A-Z])")


def without_mkl(op: str) -> str:
    """The op type with oneDNN's prefix stripped: "_MklNativeConv2D" -> "Conv2D"."""
    return MKL_PREFIX.sub("", op)


# ---- tensor names and sizes ------------------------------------------------------------------

DT_INT32 = 3  # types_pb2.DT_INT32
DT_RESOURCE = 20  # types_pb2.DT_RESOURCE: a variable's handle


def tensor(inp: str) -> tuple[str, int]:
    """A NodeDef input "op", "op:k" or "^op" as (op, k)."""
    name, _, idx = inp.lstrip("^").partition(":")
    return name, int(idx or 0)


@functools.cache
def dtype_size(enum: int) -> int | None:
    """Bytes per element of a DataType enum; None for the types whose bytes a shape does not fix
    (string, resource, variant) and for enums TensorFlow does not know."""
    import tensorflow as tf

    dtypes = tf.dtypes

    try:
        dt = dtypes.as_dtype(enum)
    except (TypeError, ValueError):
        return None
    if dt in (dtypes.string, dtypes.resource, dtypes.variant):
        return None
    return dt.size


def shape_bytes(dsize: int | None, shape) -> int | None:
    """A tensor's bytes from its dtype size and a fully known shape (else None)."""
    if dsize is None or shape is None or not all(x is not None and x >= 0 for x in shape):
        return None
    size = dsize
    for x in shape:
        size *= x
    return size
