"""The device configuration of the GPU machine an emulation stands for, kept by TensorFlow's own code.

Under `--gpus N` the real eager context is a CPU machine's, initialized by Pinpoint before the
program starts. `MachineConfig` stands in for the context in TensorFlow's own configuration
methods (`Context.set_memory_growth`, `set_logical_device_configuration`, `set_visible_devices`
and their getters, called unbound with it as `self`): it holds the GPU machine's physical
devices and the settings the program made, and counts as initialized only once the program has
used the devices. So the validation, the no-op cases and the RuntimeError texts are TensorFlow's
own, in whichever TensorFlow version is installed.
"""

from __future__ import annotations

from typing import Any

# What `get_device_details` and `device_lib.list_local_devices` describe an emulated GPU as.
EMULATED_GPU_NAME = "Pinpoint emulated GPU"
EMULATED_COMPUTE_CAPABILITY = (8, 0)


class MachineConfig:
    """The state TensorFlow's configuration methods read and write, for the emulated GPU machine."""

    def __init__(self, physical: list, pluggable: list = ()):
        self._physical_devices = list(physical)
        self._pluggable_devices = list(pluggable)
        self._visible_device_list = list(physical)
        # As TensorFlow initializes it (Context._initialize_physical_devices).
        self._memory_growth_map = {d: None for d in physical if d.device_type == "GPU"}
        self._virtual_device_map: dict = {}
        self._context_handle: Any = None  # not None once the program used the devices

    def _initialize_physical_devices(self, reinitialize=False):
        """The list is fixed: nothing to discover."""

    @property
    def initialized(self) -> bool:
        return self._context_handle is not None

    def initialize(self) -> None:
        """The program used the devices: from now on settings are refused, as TensorFlow does."""
        self._context_handle = True

    def virtual_devices(self, dev) -> list | None:
        """The logical device configuration the program set for physical device `dev` (None: none)."""
        return self._virtual_device_map.get(dev)

    def physical(self) -> list:
        return list(self._physical_devices)

    def snapshot(self) -> tuple:
        """The settings as they are now (to tell whether a call changed them)."""
        return (tuple(self._visible_device_list), tuple(sorted(self._memory_growth_map.items())),
                tuple((d, tuple(v)) for d, v in sorted(self._virtual_device_map.items())))

    def call(self, method, *args):
        """TensorFlow's own Context method (the original, unbound) on this machine's state."""
        return method(self, *args)


def gpu_details(index: int) -> dict:
    """`tf.config.experimental.get_device_details` of emulated /GPU:index, as TensorFlow answers
    it for a CUDA GPU (compute capability a tuple)."""
    return {"device_name": f"{EMULATED_GPU_NAME} {index}", "compute_capability": EMULATED_COMPUTE_CAPABILITY}


def gpu_attributes(index: int, incarnation: int):
    """A DeviceAttributes proto for emulated /GPU:index, as `device_lib.list_local_devices()` lists
    a GPU (its description carries the compute capability `tf.test.is_gpu_available` parses)."""
    from tensorflow.core.framework import device_attributes_pb2

    major, minor = EMULATED_COMPUTE_CAPABILITY
    return device_attributes_pb2.DeviceAttributes(
        name=f"/device:GPU:{index}", device_type="GPU", incarnation=incarnation,
        physical_device_desc=(f"device: {index}, name: {EMULATED_GPU_NAME} {index}, pci bus id: 0000:00:{index:02x}.0, "
                              f"compute capability: {major}.{minor}"))
