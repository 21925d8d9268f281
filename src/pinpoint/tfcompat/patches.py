"""The one way Pinpoint patches TensorFlow and Keras: `Patches`, an ExitStack of undos.

Only names registered as patched in `targets.TARGETS` can be replaced, so the registry, the
start-up check and the test that every patched name is the original again after a trace all see
every patch. Closing undoes in reverse order what was installed, also when an install failed
part-way (the stack holds exactly what was done).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from pinpoint.tfcompat.targets import TARGETS

LOCAL_DEVICES = "CollectiveAllReduceExtended._initialize_local_devices"


class Patches(contextlib.ExitStack):
    """Replacements of registered private names; `close()` (or leaving `with`) undoes them."""

    def replace(self, key: str, value: Any) -> None:
        """Set target `key` to `value` until close. The class's own __dict__ entry is what is put
        back (a staticmethod stays one)."""
        target = TARGETS[key]
        if not target.patched:
            raise KeyError(f"{key} is not registered as patched in pinpoint.tfcompat.targets")
        owner, name = target.owner()
        self.callback(setattr, owner, name, owner.__dict__[name])
        setattr(owner, name, value)

    @staticmethod
    def current(key: str) -> Any:
        """Target `key` as an attribute now (what a replacement calls), without patching it."""
        owner, name = TARGETS[key].owner()
        return getattr(owner, name)

    def op_callback(self, callback) -> Callable[[], None]:
        """TensorFlow's op callback `callback` until close; returns a function that removes it
        earlier (on the thread that added it: op callbacks are thread-local), after which close
        has nothing left to do for it."""
        from tensorflow.python.framework import op_callbacks

        op_callbacks.add_op_callback(callback)
        added = [True]

        def remove() -> None:
            if added[0]:
                added[0] = False
                op_callbacks.remove_op_callback(callback)

        self.callback(remove)
        return remove


def patch_local_devices(patches: Patches, indices: Sequence[int]) -> None:
    """MultiWorkerMirroredStrategy's local devices become logical CPUs `indices` (the emulated
    GPUs). TF picks a worker's local devices from its GPU count, 0 on a CPU-only machine (one
    replica on CPU:0); as CPUs, its collectives use the ring (NCCL needs real GPUs)."""
    local = tuple(indices)

    def initialize_local_devices(ext, cluster_resolver, worker_device):
        return tuple(f"{worker_device}/device:CPU:{i}" for i in local), "CPU"

    patches.replace(LOCAL_DEVICES, initialize_local_devices)


def originals() -> dict[str, Any]:
    """Every patched target's current __dict__ entry, by key (a test compares them by identity)."""
    out = {}
    for key, target in TARGETS.items():
        if target.patched:
            owner, name = target.owner()
            out[key] = owner.__dict__[name]
    return out
