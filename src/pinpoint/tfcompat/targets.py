"""Every private TensorFlow and Keras name Pinpoint uses, in one registry.

A `Target` names one: its module, the attribute path, the parameters Pinpoint relies on (calls
and replacements pass exactly these), whether Pinpoint patches it, and what for. `check.require()`
resolves them all when a command starts; `patches.Patches` replaces only registered, patched
ones. docs/trace.md#private-apis lists the same table for readers.
"""

from __future__ import annotations

import importlib
import inspect
import types
from dataclasses import dataclass
from typing import Any

_AF = "tensorflow.python.eager.polymorphic_function.atomic_function"
_CTX = "tensorflow.python.eager.context"
_EXE = "tensorflow.python.eager.execute"
_SPEC = "tensorflow.python.framework.device_spec"
_OPS = "tensorflow.python.framework.ops"
_MS = "tensorflow.python.distribute.mirrored_strategy"
_CARS = "tensorflow.python.distribute.collective_all_reduce_strategy"


@dataclass(frozen=True)
class Target:
    """One private name. `signature`: the parameters as `render` prints them (None: the name must
    only exist); `member`: an instance attribute, so no object holds it before the program runs:
    some method of its class must still use the name."""

    key: str  # how errors and docs name it: 'AtomicFunction.call_flat'
    module: str
    signature: str | None = None
    patched: bool = False
    member: bool = False
    path: str = ""  # the attribute path in `module` when it is not `key`
    used_for: str = ""

    @property
    def parts(self) -> list[str]:
        return (self.path or self.key).split(".")

    def resolve(self) -> Any:
        """The object (the class, for a member); AttributeError / ImportError when it moved."""
        obj = importlib.import_module(self.module)
        for part in self.parts[:-1] if self.member else self.parts:
            obj = getattr(obj, part)
        return obj

    def owner(self) -> tuple[type, str]:
        """(the class whose __dict__ holds the patched name, the name): the first in the MRO."""
        cls = importlib.import_module(self.module)
        for part in self.parts[:-1]:
            cls = getattr(cls, part)
        name = self.parts[-1]
        if isinstance(cls, types.ModuleType):  # a module-level function
            return cls, name
        for c in cls.__mro__:
            if name in c.__dict__:
                return c, name
        raise AttributeError(f"{'.'.join(self.parts)}: not defined by {cls.__name__} or its bases")


def render(fn) -> str:
    """'(self, fetches, feed_dict=None, *args)': parameter names, kinds and simple defaults (no
    annotations; a default that is not None, a bool, a number or a string shows as ...)."""
    parts, starred = [], False
    for p in inspect.signature(fn).parameters.values():
        if p.kind is p.VAR_POSITIONAL:
            parts.append("*" + p.name)
            starred = True
        elif p.kind is p.VAR_KEYWORD:
            parts.append("**" + p.name)
        else:
            if p.kind is p.KEYWORD_ONLY and not starred:
                parts.append("*")
                starred = True
            text = p.name
            if p.default is not p.empty:
                simple = p.default is None or isinstance(p.default, (bool, int, float, str))
                text += "=" + (repr(p.default) if simple else "...")
            parts.append(text)
    return "(" + ", ".join(parts) + ")"


def member_used(cls: type, name: str) -> bool:
    """True when a function defined by `cls` or a base reads or sets attribute `name`."""
    for c in cls.__mro__:
        for value in vars(c).values():
            fn = getattr(value, "__func__", value)
            fn = getattr(fn, "fget", fn)
            code = getattr(fn, "__code__", None)
            if code is not None and name in code.co_names:
                return True
    return False


_DEVICES = "emulated GPUs"

TARGETS: dict[str, Target] = {t.key: t for t in [
    # ---- patched while a program is traced (trace.recorder, trace.gpus, trace.keras_fit) ----
    Target("AtomicFunction.call_flat", _AF, "(self, *args)", patched=True,
           used_for="capture each tf.function's first calls (a known function's own attribute is TensorFlow's)"),
    Target("InterpolateRuntimeError", _AF, "(top_level_func)", patched=True,
           used_for="count each call of a known tf.function (made once per call by call_flat; the subclass "
                    "sets _func as its __init__ does)"),
    Target("make_call_op_in_graph", _AF, "(atomic, tensor_inputs, context_call_attrs)", patched=True,
           used_for="tell a call made while another function traces (a node in a graph) from one that runs"),
    Target("BaseSession.run", "tensorflow.python.client.session",
           "(self, fetches, feed_dict=None, options=None, run_metadata=None)", patched=True,
           used_for="capture a tf.compat.v1 Session.run's partition graphs"),
    Target("DeviceSpecV2._string_to_components", _SPEC, "(spec=None)", patched=True,
           used_for="translate /GPU:i to the logical CPU that emulates it"),
    Target("EagerTensor.device", _OPS, patched=True,
           used_for="name an eager tensor's (and a variable's) device /GPU:i where it is the emulated GPU i"),
    Target("EagerTensor.backing_device", _OPS, patched=True,
           used_for="name an eager tensor's memory /GPU:i where it is the emulated GPU i"),
    Target("Operation.device", _OPS, patched=True, used_for="name an op's device request /GPU:i, as it was written"),
    Target("PyTensor.device", "tensorflow.python.client._pywrap_tf_session", patched=True,
           used_for="name a graph tensor's device request /GPU:i, as it was written"),
    Target("Context.device", _CTX, "(self, name)", patched=True,
           used_for="the device an eager tf.device scope asks for, as the program wrote it (a GPU the "
                    "emulated machine lacks)"),
    Target("Context.list_logical_devices", _CTX, "(self, device_type=None)", patched=True,
           used_for=f"list the {_DEVICES} (with and without a type)"),
    Target("Context.list_physical_devices", _CTX, "(self, device_type=None)", patched=True,
           used_for=f"list the {_DEVICES}"),
    Target("Context.num_gpus", _CTX, "(self)", patched=True, used_for=f"count the {_DEVICES}"),
    Target("Context.set_memory_growth", _CTX, "(self, dev, enable)", patched=True,
           used_for=f"keep memory growth of the {_DEVICES} (taken before use, refused after)"),
    Target("Context.set_logical_device_configuration", _CTX, "(self, dev, virtual_devices)", patched=True,
           used_for="keep virtual-device settings of the emulated GPU machine (taken before use, refused after)"),
    Target("Context.set_visible_devices", _CTX, "(self, devices, device_type=None)", patched=True,
           used_for="keep visible-device settings of the emulated GPU machine (taken before use, refused after)"),
    Target("Context.get_memory_growth", _CTX, "(self, dev)", patched=True,
           used_for=f"answer memory growth of the {_DEVICES}"),
    Target("Context.get_logical_device_configuration", _CTX, "(self, dev)", patched=True,
           used_for=f"answer the virtual-device settings of the {_DEVICES}"),
    Target("Context.get_visible_devices", _CTX, "(self, device_type=None)", patched=True,
           used_for=f"answer the visible devices of the GPU machine of the {_DEVICES}"),
    Target("Context.get_device_details", _CTX, "(self, device)", patched=True,
           used_for=f"describe the {_DEVICES} (name, compute capability)"),
    Target("Context.get_memory_info", _CTX, "(self, dev)", patched=True,
           used_for=f"answer memory info of the {_DEVICES} (their logical CPU's allocator)"),
    Target("Context.reset_memory_stats", _CTX, "(self, dev)", patched=True,
           used_for=f"reset the memory stats of the {_DEVICES} (their logical CPU's allocator)"),
    Target("Context.ensure_initialized", _CTX, "(self)", patched=True,
           used_for="see the program's first use of the devices (settings are refused after it, as on a GPU)"),
    Target("device_lib.list_local_devices", "tensorflow.python.client.device_lib", "(session_config=None)",
           patched=True, path="list_local_devices",
           used_for=f"list the {_DEVICES} to tf.test.is_gpu_available and tf.test.gpu_device_name"),
    Target("Context.set_server_def", _CTX, "(self, server_def, keep_alive_secs=600)", patched=True,
           used_for="end the emulated /GPU:0 default scope when the program connects to a cluster"),
    Target("MirroredExtended.__init__", _MS, "(self, container_strategy, devices=None, cross_device_ops=None)",
           patched=True, used_for=f"give MirroredStrategy() a collective all-reduce among the {_DEVICES}"),
    Target("CollectiveAllReduceExtended._initialize_local_devices", _CARS, "(self, cluster_resolver, worker_device)",
           patched=True, used_for=f"make MultiWorkerMirroredStrategy train on the {_DEVICES}"),
    Target("Model.fit", "keras", patched=True, used_for="add the logging callback to every model.fit"),
    Target("Layer.__new__", "keras", "(cls, *args, **kwargs)", patched=True, path="layers.Layer.__new__",
           used_for="the tf.device request around a Keras layer's creation and explicit build"),
    Target("Layer.__call__", "keras", "(self, *args, **kwargs)", patched=True, path="layers.Layer.__call__",
           used_for="the tf.device request around a Keras layer's calls"),
    Target("Layer.add_weight", "keras", patched=True, path="layers.Layer.add_weight",
           used_for="the tf.device request around a Keras weight's creation"),
    Target("backend.lstm", "keras.src.backend", "(inputs, initial_state_h, initial_state_c, mask, kernel, "
           "recurrent_kernel, bias, activation, recurrent_activation, return_sequences=False, go_backwards=False, "
           "unroll=False, time_major=False)", patched=True, path="lstm",
           used_for=f"run Keras' LSTM with its generic kernels on the {_DEVICES} (cuDNN's do not exist on logical CPUs)"),
    Target("backend.gru", "keras.src.backend", "(inputs, initial_state, mask, kernel, recurrent_kernel, bias, "
           "activation, recurrent_activation, return_sequences=False, go_backwards=False, unroll=False, "
           "time_major=False, reset_after=True)", patched=True, path="gru",
           used_for=f"run Keras' GRU with its generic kernels on the {_DEVICES} (cuDNN's do not exist on logical CPUs)"),
    Target("Variable._variable_call", "tensorflow.python.ops.variables", patched=True,
           used_for="record every variable as the program creates it (strategy, devices, request, creator)"),
    Target("CollectiveReplicaLauncher.__init__", "tensorflow.python.distribute.cross_device_utils",
           "(self, group_key, group_size, collective_keys, device, options)", patched=True,
           used_for="record the collective-ordering token each all-reduce launcher of a strategy makes "
                    "(TensorFlow's own variable, made past tf.Variable), also when the strategy is dropped"),
    # ---- read or called ----
    Target("device_spec._STRING_TO_COMPONENTS_CACHE", _SPEC, path="_STRING_TO_COMPONENTS_CACHE",
           used_for="forget device strings parsed before emulation"),
    Target("context._device_parsing_cache", _CTX, path="_device_parsing_cache",
           used_for="forget device strings parsed before emulation"),
    Target("LogicalDevice", _CTX, "(name, device_type)", used_for=f"list the {_DEVICES}"),
    Target("Context._soft_device_placement", _CTX, member=True,
           used_for="resolve a GPU index the emulated machine lacks as soft placement does"),
    Target("Context._initialize_physical_devices", _CTX, "(self, reinitialize=False)",
           used_for="the GPU machine's device settings, kept by TensorFlow's own methods (tfcompat.devices)"),
    Target("Context._physical_devices", _CTX, member=True,
           used_for="the GPU machine's device settings, kept by TensorFlow's own methods (tfcompat.devices)"),
    Target("Context._pluggable_devices", _CTX, member=True,
           used_for="the GPU machine's device settings, kept by TensorFlow's own methods (tfcompat.devices)"),
    Target("Context._visible_device_list", _CTX, member=True,
           used_for="the GPU machine's device settings, kept by TensorFlow's own methods (tfcompat.devices)"),
    Target("Context._memory_growth_map", _CTX, member=True,
           used_for="the GPU machine's device settings, kept by TensorFlow's own methods (tfcompat.devices)"),
    Target("Context._virtual_device_map", _CTX, member=True,
           used_for="the GPU machine's device settings, kept by TensorFlow's own methods (tfcompat.devices)"),
    Target("Context._context_handle", _CTX, member=True,
           used_for="the GPU machine's device settings, kept by TensorFlow's own methods (tfcompat.devices)"),
    Target("PhysicalDevice", _CTX, "(name, device_type)", used_for=f"list the {_DEVICES}"),
    Target("context.context", _CTX, "()", path="context", used_for="the eager context (graph collection)"),
    Target("context.async_wait", _CTX, "()", path="async_wait", used_for="wait for a captured call's graphs"),
    Target("Context.device_name", _CTX, used_for="tell the emulated default scope from a program's request"),
    Target("Context.executor", _CTX, used_for="wait for a closure's remote call (its thread's executor)"),
    Target("Executor.wait", "tensorflow.python.eager.executor", "(self)",
           used_for="wait for a closure's remote call (its thread's executor)"),
    Target("Context.enable_graph_collection", _CTX, "(self)", used_for="record partition graphs"),
    Target("Context.disable_graph_collection", _CTX, "(self)", used_for="record partition graphs"),
    Target("Context.enable_run_metadata", _CTX, "(self)", used_for="the step stats of a traced call"),
    Target("Context.disable_run_metadata", _CTX, "(self)", used_for="the step stats of a traced call"),
    Target("Context.export_run_metadata", _CTX, "(self)", used_for="read the recorded graphs"),
    Target("op_callbacks.add_op_callback", "tensorflow.python.framework.op_callbacks", "(callback_fn)",
           path="add_op_callback", used_for="see every eager op of a traced program"),
    Target("op_callbacks.remove_op_callback", "tensorflow.python.framework.op_callbacks", "(op_callback)",
           path="remove_op_callback", used_for="see every eager op of a traced program"),
    Target("AtomicFunction._bound_context", _AF, member=True, used_for="skip calls made while tracing"),
    Target("pywrap_tfe.TFE_Py_FastPathExecute", "tensorflow.python.pywrap_tfe", patched=True,
           path="TFE_Py_FastPathExecute",
           used_for="count the reads of variables passed straight to an op (the C fast path makes them "
                    "without the op callback)"),
    Target("BaseResourceVariable", "tensorflow.python.ops.resource_variable_ops",
           used_for="count the reads of variables passed straight to an op (the C fast path makes them "
                    "without the op callback)"),
    Target("Context._thread_local_data", _CTX, member=True,
           used_for="switch the eager op callback off and on again (a thread's callback list)"),
    Target("execute.execute", _EXE, path="execute",
           used_for="switch the eager op callback off and on again (the slow path, as TensorFlow does)"),
    Target("execute.quick_execute", _EXE, "(op_name, num_outputs, inputs, attrs, ctx, name=None)",
           path="quick_execute", used_for="switch the eager op callback off and on again (the slow path, as TensorFlow does)"),
    Target("execute.execute_with_callbacks", _EXE, "(op_name, num_outputs, inputs, attrs, ctx, name=None)",
           path="execute_with_callbacks",
           used_for="switch the eager op callback off and on again (the slow path, as TensorFlow does)"),
    Target("Context.coordination_service", _CTX,
           used_for="keep TensorFlow's profiler out of a task of a multi-process cluster (it crashes there)"),
    Target("ops.EagerTensor", _OPS, path="EagerTensor",
           used_for="tell a tf.function's eager calls from calls traced into another function"),
    Target("Graph._functions", _OPS, member=True, used_for="output shapes of the functions a graph calls"),
    Target("Graph._device_function_stack", _OPS, member=True,
           used_for="the tf.device request a Keras layer or weight is made under, while tracing"),
    Target("_UserDeviceSpec.string_merge", _OPS, "(self, node_def)",
           used_for="merge the tf.device scopes as TensorFlow does for a new op"),
    Target("Operation._set_attr", _OPS, "(self, attr_name, attr_value)",
           used_for="mark ops placed on the emulated /GPU:0"),
    Target("Operation._set_device", _OPS, "(self, device)", patched=True,
           used_for="place a tf.compat.v1 graph as a GPU machine does; a device name shown as /GPU:i set back "
                    "as the logical CPU that emulates it (a gradient colocated with its op)"),
    Target("_pywrap_kernel_registry.TryFindKernelClass", "tensorflow.python.util._pywrap_kernel_registry",
           path="TryFindKernelClass", used_for="which ops have a GPU kernel (predicted fallbacks)"),
    Target("op_def_registry.get", "tensorflow.python.framework.op_def_registry", "(name)", path="get",
           used_for="op definitions (kernel lookups, type attributes)"),
    Target("dtypes.as_dtype", "tensorflow.python.framework.dtypes", "(type_value)", path="as_dtype",
           used_for="name a type attribute's dtypes"),
    Target("mirrored_strategy.all_local_devices", _MS, "(num_gpus=None)", path="all_local_devices",
           used_for=f"MirroredStrategy()'s default devices on the {_DEVICES}"),
    Target("device_util.canonicalize", "tensorflow.python.distribute.device_util", "(d, default=None)",
           path="canonicalize", used_for=f"MirroredStrategy()'s devices on the {_DEVICES}"),
    Target("CollectiveKeys", "tensorflow.python.distribute.cross_device_utils", "(group_key_start=1)",
           used_for="a fresh collective group key per strategy"),
    Target("CollectiveReplicaLauncher._ordering_token", "tensorflow.python.distribute.cross_device_utils",
           member=True, used_for="class TensorFlow's collective-ordering tokens as internal variables"),
    Target("collective_util.Options", "tensorflow.python.distribute.collective_util",
           "(bytes_per_pack=0, timeout_seconds=None, implementation=...)", path="Options",
           used_for="the ring all-reduce (train.all_reduce: ring)"),
    Target("CollectiveAllReduce", "tensorflow.python.distribute.cross_device_ops",
           "(devices, group_size, options, collective_keys=None, canonicalize_devices=True)",
           used_for="the ring all-reduce (train.all_reduce: ring)"),
    Target("DatasetV2._as_serialized_graph", "tensorflow.python.data.ops.dataset_ops",
           "(self, allow_stateful=None, strip_device_assignment=None, external_state_policy=...)",
           used_for="where an input pipeline's ops run"),
    Target("BaseResourceVariable._shared_name", "tensorflow.python.ops.resource_variable_ops", member=True,
           used_for="match a variable to its resource in the graphs"),
    Target("BaseResourceVariable._handle", "tensorflow.python.ops.resource_variable_ops", member=True,
           used_for="a variable's device as the runtime names it, while the program is shown /GPU:i"),
    Target("Layer._flatten_layers", "keras", "(self, include_self=True, recursive=True)",
           path="layers.Layer._flatten_layers", used_for="the layer paths train.pinning.layers matches"),
    Target("name_scope.current_path", "keras.src.backend.common.name_scope", "()", path="current_path",
           used_for="the layer a variable is created in (train.pinning.layers)"),
    Target("keras.Variable._value", "keras.src.backend.common.variables", member=True, path="Variable._value",
           used_for="the tf.Variable a Keras variable wraps"),
    Target("Model._initial_epoch", "keras", member=True, path="Model._initial_epoch",
           used_for="resume model.fit at the checkpoint's epoch"),
]}
