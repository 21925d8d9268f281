"""DeviceMap: spec <-> physical names under emulation (no TensorFlow needed)."""

import pytest

from pinpoint.device_names import DeviceMap

pytestmark = pytest.mark.unit


def _emulated():
    return DeviceMap(
        aliases={"/GPU:0": "/CPU:1", "/GPU:1": "/CPU:2"},
        replica_devices=("/CPU:1", "/CPU:2"),
        spec_replica_devices=("/GPU:0", "/GPU:1"),
        emulated=True,
        local_devices=("/CPU:0", "/CPU:1", "/CPU:2"),
    )


def test_physical_maps_gpus_to_logical_cpus_and_keeps_the_host():
    dm = _emulated()
    assert dm.physical("/GPU:0") == "/CPU:1"
    assert dm.physical("/GPU:1") == "/CPU:2"
    assert dm.physical("/device:GPU:1") == "/CPU:2"
    assert dm.physical("/CPU:0") == "/CPU:0"  # the host is never an emulated GPU


def test_job_prefixes_are_kept():
    dm = _emulated()
    assert dm.physical("/job:worker/task:1/GPU:1") == "/job:worker/task:1/CPU:2"


def test_spec_reverses_full_runtime_names():
    dm = _emulated()
    assert dm.spec("/job:localhost/replica:0/task:0/device:CPU:1") == "/job:localhost/replica:0/task:0/device:GPU:0"
    assert dm.spec("/CPU:2") == "/GPU:1"
    assert dm.spec("/CPU:0") == "/CPU:0"
    assert dm.spec("/job:worker/task:1/CPU:2") == "/job:worker/task:1/GPU:1"


def test_fallbacks_route_missing_gpus_to_the_host():
    dm = DeviceMap(aliases={}, replica_devices=("/CPU:0",), spec_replica_devices=("/GPU:0",),
                   fallbacks={"/GPU:0": "/CPU:0"})
    assert dm.physical("/GPU:0") == "/CPU:0"
    assert dm.to_json()["fallbacks"] == {"/GPU:0": "/CPU:0"}


def test_to_json_records_the_aliases():
    j = _emulated().to_json()
    assert j["device_aliases"] == {"/GPU:0": "/CPU:1", "/GPU:1": "/CPU:2"}
    assert j["emulated"] is True and j["host"] == "/CPU:0"
