"""Make an unchanged program's GPU names mean emulated GPUs (logical CPU devices).

A program written for N GPUs spells them `/GPU:i` in `tf.device`, asks
`tf.config.list_logical_devices("GPU")`, and builds `MirroredStrategy()` on the GPUs it finds.
On a CPU-only machine `emulate(n)` gives the process logical CPUs: `/CPU:0` stays the host,
`/CPU:1`..`/CPU:OWN_CPUS` are kept for the program's own (a program that splits the host CPU, as
TensorFlow's distributed-input guide does), `/CPU:FIRST_GPU+i` stands in for `/GPU:i`; `GpuNames`
makes every spelling follow:

- device strings: TensorFlow parses every device request (`tf.device`, Keras device scopes,
  strategy device lists, `tf.DeviceSpec` strings) through `DeviceSpecV2._string_to_components`;
  a GPU there is translated to its logical CPU, so the runtime, the graphs and the report all see
  one consistent physical name, which the DeviceMap shows as the GPU again;
- a GPU index the machine lacks resolves to /GPU:0, as soft placement resolves it there;
- the program's own CPUs: `/CPU:j` is runtime `/CPU:j` when the program configured more than j
  logical CPUs (so runtime names parse back to themselves); a CPU it did not configure is soft-placed
  as a missing GPU index is;
- device questions: logical and physical listings (with or without a type), device details and
  `device_lib.list_local_devices` (tf.test.is_gpu_available) answer as the n-GPU machine, so
  Keras' own choices (jit_compile="auto" asks whether a non-CPU device exists) are its choices;
- device settings: TensorFlow's own Context methods keep them on the GPU machine's configuration
  (`tfcompat.devices.MachineConfig`), taken before the program first uses the devices and refused
  after with TensorFlow's RuntimeError; what a taken setting cannot change here is in `ignored`;
- `MirroredStrategy()` with TensorFlow's default cross-device ops all-reduces with a collective
  among the emulated GPUs (the stand-in for NCCL), as `train.all_reduce: auto` does;
- `MultiWorkerMirroredStrategy` takes the emulated GPUs as each task's local devices;
- `default_scope()`: ops with no device request run on the emulated `/GPU:0`, where a GPU
  machine's runtime puts them (entered around the program), until the program connects to a
  cluster (a parameter-server coordinator): the scope names the old job, so it ends there.
"""

from __future__ import annotations

import contextlib
import functools
import threading

from pinpoint.device_names import DeviceMap, emulation_aliases, normalize, parse_name
from pinpoint.errors import PlacementError
from pinpoint.tfcompat.api import forget_parsed_devices, logical_device, physical_device, soft_placement
from pinpoint.tfcompat.devices import MachineConfig, gpu_attributes, gpu_details
from pinpoint.tfcompat.patches import Patches, patch_local_devices, show_device_names

GPU = "GPU"
# Logical CPUs kept for a program that splits the host CPU itself (/CPU:1../CPU:OWN_CPUS; it may
# configure up to OWN_CPUS + 1). Measured: 10 logical CPUs instead of 3 start in the same time
# (~0.02 s), with the same threads and memory (CPU devices share TensorFlow's thread pools).
OWN_CPUS = 7
FIRST_GPU = OWN_CPUS + 1  # the logical CPU that emulates /GPU:0
# A CPU the program did not configure, requested in a graph: /CPU:MISSING_CPU+j names no device, so
# TensorFlow's placer soft-places it (as a missing GPU index).
MISSING_CPU = 1000


def emulate(n: int) -> DeviceMap:
    """n emulated GPUs on logical CPUs FIRST_GPU.. (before TensorFlow initializes its devices),
    after the ones kept for the program's own."""
    import tensorflow as tf

    from pinpoint.devices import configure_logical_cpus

    try:
        have = configure_logical_cpus(tf, FIRST_GPU + n)
    except PlacementError:  # initialized before with fewer (a second trace in one process): none kept
        have = configure_logical_cpus(tf, n + 1)
    aliases = emulation_aliases(range(n), first=have - n)
    return DeviceMap(aliases=aliases, replica_devices=tuple(aliases[f"/GPU:{i}"] for i in range(n)),
                     spec_replica_devices=tuple(f"/GPU:{i}" for i in range(n)), emulated=True,
                     local_devices=("/CPU:0", *aliases.values()))


def real_gpus(n: int) -> DeviceMap:
    """The machine's own GPUs (nothing emulated)."""
    import tensorflow as tf

    have = len(tf.config.list_physical_devices(GPU))
    devices = tuple(f"/GPU:{i}" for i in range(min(n, have) if n else have))
    return DeviceMap(aliases={}, replica_devices=devices or ("/CPU:0",), spec_replica_devices=devices or ("/CPU:0",),
                     local_devices=("/CPU:0", *devices))


def device_map_for(gpus: int | None) -> DeviceMap:
    """Emulate `gpus` GPUs when the machine has fewer; else use the real ones."""
    import tensorflow as tf

    if gpus and len(tf.config.list_physical_devices(GPU)) < gpus:
        return emulate(gpus)
    return real_gpus(gpus or 0)


class GpuNames:
    """The patches that make GPU names mean the emulated GPUs; `install()` / `uninstall()`."""

    def __init__(self, dm: DeviceMap):
        self.dm = dm
        self.n = len(dm.spec_replica_devices)
        # The logical CPU that emulates /GPU:0; the ones before it but the host are the program's own.
        self.first = parse_name(dm.aliases["/GPU:0"])[3] if "/GPU:0" in dm.aliases else FIRST_GPU
        self.own = self.first - 1
        self.ignored: list[str] = []  # what emulation could not follow, and how it answered instead
        self.missing: dict[str, str] = {}  # GPU requests the machine lacks -> the logical CPU they name
        self.machine: MachineConfig | None = None  # the GPU machine's device settings
        self._armed = False
        self._patches = Patches()
        self._default: _DefaultScope | None = None
        self._requests = threading.local()  # .stack: the eager scopes' requests (`_install_scopes`)

    # ---- patches ----------------------------------------------------------------------------
    def install(self) -> GpuNames:
        if not self.dm.emulated:
            return self
        self._install_names()
        self._install_scopes()
        self._install_reads()
        self._install_listings()
        self._install_settings()
        self._install_strategies()
        self._install_cudnn()
        return self

    def arm(self) -> None:
        """The program starts: its first use of the devices from now on initializes the GPU
        machine (Pinpoint's own set-up before it does not)."""
        self._armed = True

    def _install_names(self) -> None:
        """Device strings: /GPU:i is logical CPU FIRST_GPU+i; "/GPU" (any GPU) is the first one; the
        program's /CPU:j is logical CPU j if it configured it (`_cpu_index`)."""
        parse = Patches.current("DeviceSpecV2._string_to_components")

        def string_to_components(spec=None):
            job, replica, task, dtype, index = parse(spec)
            if dtype == GPU:
                return job, replica, task, "CPU", self._gpu_index(index) + self.first
            # A runtime's full name (TensorFlow lists its devices so) is the device itself.
            if dtype == "CPU" and index is not None and 1 <= index <= self.own and job != "localhost":
                return job, replica, task, "CPU", self._cpu_index(index)
            return job, replica, task, dtype, index

        self._patch("DeviceSpecV2._string_to_components", staticmethod(string_to_components))
        forget_parsed_devices()

    def _install_scopes(self) -> None:
        """Eager tf.device scopes, as the program wrote them: TensorFlow names an eager scope by the
        device it parsed, and a GPU the machine lacks parses as /GPU:0 (soft placement), so the
        request itself is kept here, per thread (`eager_request`)."""
        device = Patches.current("Context.device")
        requests = self._requests

        def scoped(ctx, name):
            return _Written(device(ctx, name), requests, self._missing_alias(name))

        self._patch("Context.device", scoped)

    def _missing_alias(self, name) -> str | None:
        """The runtime name standing for a written GPU the machine lacks ('/GPU:2' -> '/CPU:10', as
        `_gpu_index` records it in `missing`), '' for a scope naming a device that exists, None for
        one naming no device type (it keeps the enclosing scope's)."""
        if not isinstance(name, str):
            name = getattr(name, "name", None)  # a LogicalDevice
            if not isinstance(name, str):
                return None
        _, _, dtype, index = parse_name(name)
        if dtype is None:
            return None
        if dtype == GPU and index is not None and index >= self.n and soft_placement():
            return f"/CPU:{index + self.first}"
        return ""

    def eager_request(self, requested: str) -> str:
        """The device an eager op's scope asked for: `requested` (TensorFlow's name of the scope),
        or the runtime name of the GPU the machine lacks that the innermost scope wrote."""
        stack = getattr(self._requests, "stack", None)
        return stack[-1] if stack and stack[-1] else requested

    def _install_reads(self) -> None:
        """Device names read back: a tensor, a variable or an op on the logical CPU that emulates
        /GPU:i says `.../device:GPU:i`, as on the GPU machine (Pinpoint reads the runtime's name,
        `device_of`)."""
        gpus = {f"CPU:{parse_name(cpu)[3]}": gpu.lstrip("/") for gpu, cpu in self.dm.aliases.items()}
        cpus = {gpu: cpu for cpu, gpu in gpus.items()}

        def renaming(table):
            @functools.lru_cache(maxsize=1024)
            def rename(name: str) -> str:
                head, sep, tail = name.rpartition("device:") if name else ("", "", "")
                return head + sep + table[tail] if sep and tail in table else name

            return rename

        show_device_names(self._patches, renaming(gpus), renaming(cpus))

    def _gpu_index(self, index: int | None) -> int:
        """The logical GPU a request for /GPU:index names. A missing index (the program asks for
        more GPUs than the machine has) resolves as TensorFlow's soft placement resolves it on a
        GPU machine, where no device matches the request and the placer drops its type and index:

        - in a graph (a tf.function), tensorflow/core/common_runtime/colocation_graph.cc:
          ColocationGraph::GetDevicesForNode calls GetSoftDeviceCandidates (soft device name from
          Member::GetSoftDeviceName) and ColocationGraph::FilterSupportedDevices puts the
          function's own device first, then by type priority (GPU before CPU). The index is kept:
          it names a logical CPU that does not exist, TensorFlow's placer does the same here, and
          the report shows the request as written (DeviceMap.missing);
        - eagerly, common_runtime/eager/context.cc: EagerContext::SelectDevice clears type and id
          and takes the best of the prioritized devices, /GPU:0 on a GPU machine (the host here:
          all logical CPUs rank alike), so the request becomes /GPU:0.

        Without soft placement the request stays unsatisfiable and fails, as there."""
        import tensorflow as tf

        if index is None:
            return 0
        if index < self.n or not soft_placement():
            return index
        written = f"/GPU:{index}"
        self._soft_placed(written, f"/CPU:{index + self.first}",
                          f"which a machine with {self.n} GPU(s) does not have")
        return 0 if tf.executing_eagerly() else index

    def _soft_placed(self, written: str, runtime: str, why: str) -> None:
        """Record a request no device matches (`runtime`: the logical CPU it names) and say once
        where soft placement runs it."""
        self.missing.setdefault(written, runtime)
        self._note(f"the program requested {written}, {why}: soft placement runs it where a GPU machine's placer "
                   "does (the request's type and index dropped): an eager op on /GPU:0, an op in a tf.function on "
                   f"the function's own device; those ops are fallbacks from {written}")

    def own_cpus(self) -> int:
        """How many logical CPUs the program has: its own split of the host CPU, else 1."""
        host = [d for d in self.machine.physical() if d.device_type == "CPU"] if self.machine else []
        return len(self.machine.virtual_devices(host[0]) or [None]) if host else 1

    def _cpu_index(self, index: int) -> int:
        """The logical CPU a request for the program's /CPU:index (1 <= index <= self.own) names:
        itself when the program configured it; else the request matches no device, as on a GPU
        machine, and soft placement drops its type and index (see `_gpu_index`): eagerly the op
        runs on /GPU:0 (the best device by type priority), in a graph the index names no device and
        TensorFlow's placer puts the op on the function's own device. Runtime names /CPU:j of the
        program's CPUs parse back to themselves."""
        import tensorflow as tf

        if index < self.own_cpus():
            return index
        if not soft_placement():
            return MISSING_CPU + index  # unsatisfiable, as there
        written = f"/CPU:{index}"
        self._soft_placed(written, f"/CPU:{MISSING_CPU + index}", f"but it has {self.own_cpus()} logical CPU(s)")
        return self.first if tf.executing_eagerly() and self.n else MISSING_CPU + index

    def _install_listings(self) -> None:
        """Device listings and descriptions answer as the GPU machine: /CPU:0 and the n GPUs."""
        import tensorflow as tf

        list_logical = Patches.current("Context.list_logical_devices")
        details = Patches.current("Context.get_device_details")
        local = Patches.current("device_lib.list_local_devices")
        emulated = {normalize(p) for p in self.dm.aliases.values()}
        gpus = [physical_device(f"/physical_device:GPU:{i}", GPU) for i in range(self.n)]
        host = [d for d in tf.config.list_physical_devices() if d.device_type != GPU]  # not yet patched
        self.machine = MachineConfig(host + gpus)

        def logical(ctx, device_type=None):
            found = [d for d in list_logical(ctx, None) if normalize(d.name) not in emulated and not _kept(d, 1, self.own)]
            cpus = self.machine.virtual_devices(host[0]) if host else None
            if cpus:  # the program split the host CPU: its own setting, as it reads it back (see _not_applied)
                found = [logical_device(f"/device:CPU:{j}", "CPU") for j in range(len(cpus))] + [
                    d for d in found if d.device_type != "CPU"]
            found += [logical_device(f"/device:GPU:{i}", GPU) for i in range(self.n)]
            return [d for d in found if device_type is None or d.device_type == device_type]

        def physical(ctx, device_type=None):
            return [d for d in self.machine.physical() if device_type is None or d.device_type == device_type]

        def device_details(ctx, device):
            if _is_gpu(device) and device in gpus:
                return gpu_details(gpus.index(device))
            return details(ctx, device)

        def local_devices(session_config=None):
            found = [d for d in local(session_config) if normalize(d.name) not in emulated
                     and not _kept(d, self.own_cpus(), self.own)]
            return found + [gpu_attributes(i, incarnation=0x5EED + i) for i in range(self.n)]

        def num_gpus(ctx):
            self._used()
            return self.n

        for key in ("Context.get_memory_info", "Context.reset_memory_stats"):
            self._patch(key, self._memory(key))
        self._patch("Context.list_logical_devices", logical)
        self._patch("Context.list_physical_devices", physical)
        self._patch("Context.get_device_details", device_details)
        self._patch("device_lib.list_local_devices", local_devices)
        self._patch("Context.num_gpus", num_gpus)

    def _memory(self, key: str):
        """get_memory_info / reset_memory_stats of an emulated GPU: its logical CPU's allocator."""
        original = Patches.current(key)
        name = key.rsplit(".", 1)[1]

        def on_device(ctx, dev):
            _, _, dtype, index = parse_name(dev if str(dev).startswith("/") else f"/{dev}")
            if dtype != GPU or index is None or index >= self.n:
                return original(ctx, dev)
            self._note(f"{name}: an emulated GPU's memory is its logical CPU's allocator, which the host and "
                       "every emulated GPU share: the numbers are the process's host tensors, not one GPU's")
            return original(ctx, f"CPU:{index + self.first}")

        return on_device

    def _install_settings(self) -> None:
        """Device settings go to the GPU machine's configuration (TensorFlow's own methods): taken
        before the program uses the devices, refused after with TensorFlow's RuntimeError."""
        init = Patches.current("Context.ensure_initialized")

        def ensure_initialized(ctx):
            self._used()
            return init(ctx)

        self._patch("Context.ensure_initialized", ensure_initialized)
        for key in ("Context.get_memory_growth", "Context.get_logical_device_configuration",
                    "Context.get_visible_devices"):
            self._patch(key, _on_machine(self.machine, Patches.current(key)))
        for key in ("Context.set_memory_growth", "Context.set_logical_device_configuration",
                    "Context.set_visible_devices"):
            self._patch(key, self._setting(key))

    def _setting(self, key: str):
        original = Patches.current(key)
        name = key.rsplit(".", 1)[1]

        def apply(ctx, *args, **kwargs):
            args = (*args, *kwargs.values())  # (dev, value): every caller in TensorFlow passes them in order
            before = self.machine.snapshot()
            out = self.machine.call(original, *args)
            if self.machine.snapshot() != before:
                forget_parsed_devices()  # the program's CPUs changed what /CPU:j parses to
                if note := _not_applied(name, args, self.n, self.first):
                    self._note(note)
            return out

        return apply

    def _used(self) -> None:
        if self._armed:
            self.machine.initialize()

    def _install_cudnn(self) -> None:
        """Keras' LSTM and GRU see a GPU and take cuDNN's fused kernel (CudnnRNNV3), which has no CPU
        kernel: on emulated GPUs the program would fail where a GPU machine runs. Their cuDNN path
        answers as Keras' own does when cuDNN cannot run (NotImplementedError), so Keras runs its
        generic kernels; every other choice (the layer turning XLA off, as it does for cuDNN) stays
        the GPU machine's, and the report says the GPU machine runs one cuDNN kernel instead."""
        def no_cudnn(*args, **kwargs):
            self._note("Keras' LSTM/GRU: a GPU machine runs each as one cuDNN kernel (CudnnRNNV3) on its device; "
                       "cuDNN's kernels do not exist on logical CPUs, so emulation runs Keras' generic kernels "
                       "(more ops, on the same device)")
            raise NotImplementedError

        for key in ("backend.lstm", "backend.gru"):
            try:
                self._patch(key, no_cudnn)
            except (ImportError, AttributeError):
                pass  # a Keras without these: nothing picks cuDNN

    def _note(self, note: str) -> None:
        if note not in self.ignored:
            self.ignored.append(note)

    def _install_strategies(self) -> None:
        init = Patches.current("MirroredExtended.__init__")
        dm = self.dm

        def mirrored_init(ext, container_strategy, devices=None, cross_device_ops=None):
            import tensorflow as tf

            # Eagerly (TF2) TensorFlow's own default among the emulated GPUs (CPU devices) already is
            # the ring collective: a second one would add collective-ordering variables a real
            # strategy does not have. A tf.compat.v1 graph's default would reduce on one device.
            if cross_device_ops is None and not tf.compat.v1.executing_eagerly_outside_functions():
                cross_device_ops = _emulated_all_reduce(devices, dm)
            init(ext, container_strategy, devices=devices, cross_device_ops=cross_device_ops)

        self._patch("MirroredExtended.__init__", mirrored_init)
        # MultiWorkerMirroredStrategy: each task's local devices are the emulated GPUs.
        patch_local_devices(self._patches, [int(p.rsplit(":", 1)[1]) for p in dm.replica_devices])
        set_server_def = Patches.current("Context.set_server_def")

        def connect(ctx, server_def, *args, **kwargs):
            self._leave_default_scope(server_def.job_name)
            return set_server_def(ctx, server_def, *args, **kwargs)

        self._patch("Context.set_server_def", connect)

    def _leave_default_scope(self, job: str) -> None:
        """The program connects to a cluster as `job`: the default scope ends.

        Eager device scopes are fully named, and '/job:localhost/...' is no device of the
        connected context (TensorFlow rejects every op under it). The coordinator's own
        unrequested ops then go where TensorFlow puts them, as Pinpoint's own parameter_server
        coordinator keeps TensorFlow's default (training/entrypoint/context.py): the same as the
        plain-TensorFlow run of the differential suite.
        """
        d = self._default
        if d is None or not d.left_by(threading.get_ident()):
            return
        note = (f"set_server_def: the program connected to a cluster as /job:{job}; from then on its ops with no "
                "device request ran where TensorFlow puts them, not on the emulated /GPU:0")
        if note not in self.ignored:
            self.ignored.append(note)

    def _patch(self, key: str, value) -> None:
        """Replace registered target `key` (pinpoint.tfcompat.targets) until `uninstall`."""
        self._patches.replace(key, value)

    def uninstall(self) -> None:
        """Undo what `install` did (also a part-way install), newest first."""
        self._patches.close()

    # ---- the default device ----------------------------------------------------------------
    def default_scope(self):
        """Unrequested ops on the emulated /GPU:0, as a GPU machine's runtime places them.

        A device scope around the program: eager ops and the calls of tf.functions (whose
        unrequested ops run on the call's device) go there; ops that read a variable follow the
        variable. Ops with no GPU kernel still run there (a logical CPU runs anything): the
        report lists them as predicted fallbacks from TensorFlow's kernel registry.
        """
        if not self.dm.emulated or not self.n:
            return contextlib.nullcontext()
        import tensorflow as tf

        self._default = _DefaultScope(tf.device("/device:" + self.dm.aliases["/GPU:0"].lstrip("/")))
        return self._default


class _Written:
    """An eager tf.device scope (`scope`, TensorFlow's) that also keeps what the program wrote on
    its thread's stack while it is entered (`alias`: see GpuNames._missing_alias)."""

    def __init__(self, scope, requests: threading.local, alias: str | None):
        self.scope, self.requests, self.alias = scope, requests, alias

    def __enter__(self):
        out = self.scope.__enter__()
        stack = self.requests.__dict__.setdefault("stack", [])
        stack.append(self.alias if self.alias is not None else (stack[-1] if stack else ""))
        return out

    def __exit__(self, *exc):
        stack = self.requests.__dict__.get("stack")
        if stack:
            stack.pop()
        return self.scope.__exit__(*exc)


class _DefaultScope:
    """The default device scope, which the program's connection to a cluster can end early."""

    def __init__(self, scope):
        self._scope = scope
        self._thread: int | None = None  # the thread that entered it (device scopes are per thread)
        self._name = ""

    def __enter__(self) -> _DefaultScope:
        from pinpoint.tfcompat.api import current_device

        self._scope.__enter__()
        self._thread, self._name = threading.get_ident(), current_device()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._thread = None
            self._scope.__exit__(None, None, None)

    def left_by(self, thread: int) -> bool:
        """Exit now if `thread` entered it and no scope of the program's is inside it."""
        from pinpoint.tfcompat.api import current_device

        if self._thread != thread or current_device() != self._name:
            return False
        self.__exit__(None, None, None)
        return True


def _on_machine(machine: MachineConfig, getter):
    """A Context getter answered from the GPU machine's configuration."""
    return lambda ctx, *args: machine.call(getter, *args)


def _kept(dev, configured: int, kept: int) -> bool:
    """A logical CPU kept for the program's own CPUs (1..kept) beyond the ones it configured."""
    _, _, dtype, index = parse_name(normalize(dev.name))
    return dtype == "CPU" and index is not None and configured <= index <= kept


def _not_applied(name: str, args: tuple, n: int, first: int) -> str | None:
    """What a device setting the program made (before using the devices) does under emulation
    (None: it is applied, as on a GPU machine)."""
    dev = args[0] if args else None
    if name == "set_logical_device_configuration" and getattr(dev, "device_type", None) == "CPU":
        if len(args[1]) <= first:
            return None  # its CPUs are logical CPUs of their own
        return (f"{name}: the program split the host CPU into {len(args[1])} logical CPUs; under --gpus {n} "
                f"emulation keeps {first} for it: tf.config lists its {len(args[1])} CPUs, but a request for "
                f"/CPU:{first}../CPU:{first + n - 1} runs on the emulated /GPU:0../GPU:{n - 1} (and is listed "
                "there) and a higher one does not exist and is soft-placed")
    what = {"set_memory_growth": "memory growth of the emulated GPUs (logical CPUs have no GPU memory)",
            "set_logical_device_configuration": "GPU virtual devices (memory_limit): the logical GPUs stay one per "
                                                "emulated GPU",
            "set_visible_devices": "visible devices: every emulated GPU stays visible"}[name]
    return (f"{name}: accepted before the program used the devices, as on a GPU machine, and answered back by "
            f"tf.config; not applied: {what}")


def _is_gpu(dev) -> bool:
    return getattr(dev, "device_type", None) == GPU


def _emulated_all_reduce(devices, dm: DeviceMap):
    """MirroredStrategy's default cross-device ops on emulated GPUs: the ring collective (None
    when a device is not an emulated GPU: TensorFlow's own choice)."""
    from pinpoint.device_names import local_name
    from pinpoint.distribute.strategies import mirrored_ops
    from pinpoint.tfcompat.api import canonical_device, local_devices

    names = list(devices) if devices else local_devices()
    physical = [canonical_device(d) for d in names]
    emulated = {p.lstrip("/") for p in dm.aliases.values()}
    if len(physical) < 2 or any(local_name(p).lstrip("/") not in emulated for p in physical):
        return None
    return mirrored_ops("auto", physical, dm.host, emulated=True)
