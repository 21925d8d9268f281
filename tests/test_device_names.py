"""pinpoint.device_names: parsing, canonical forms, comparison and the emulation mapping."""

import subprocess
import sys

import pytest

from pinpoint.device_names import (
    DeviceMap,
    emulation_aliases,
    local_name,
    matches,
    normalize,
    parse_device,
    parse_name,
    sort_key,
    split_prefix,
)

pytestmark = pytest.mark.unit

ALIASES = {"/GPU:0": "/CPU:1", "/GPU:1": "/CPU:2"}


# ---- parsing -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "device,expected",
    [
        ("/GPU:1", (None, None, "GPU", 1)),
        ("/CPU:0", (None, None, "CPU", 0)),
        ("/device:GPU:0", (None, None, "GPU", 0)),
        ("/job:ps/task:1/CPU:0", ("ps", 1, "CPU", 0)),
        ("/job:worker/replica:0/task:2/device:GPU:3", ("worker", 2, "GPU", 3)),
        ("/job:localhost/task:0/GPU:0", ("localhost", 0, "GPU", 0)),
    ],
)
def test_parse_device(device, expected):
    assert parse_device(device) == expected


@pytest.mark.parametrize("device", ["gpu0", "/gpu:0", "/GPU:x", "/job:Worker/GPU:0", "GPU:0", "/XPU:0", ""])
def test_parse_device_refuses_malformed_strings(device):
    with pytest.raises(ValueError, match="is not a TensorFlow device string; write it like '/GPU:0'"):
        parse_device(device)


@pytest.mark.parametrize(
    "device,expected",
    [
        ("/job:localhost/replica:0/task:0/device:CPU:1", (None, None, "CPU", 1)),
        ("/job:worker/replica:0/task:1/device:GPU:0", ("worker", 1, "GPU", 0)),
        ("/device:gpu:2", (None, None, "GPU", 2)),
        ("/job:ps", ("ps", None, None, None)),
        ("/GPU:*", (None, None, "GPU", None)),
        ("", (None, None, None, None)),
        ("not a device", (None, None, None, None)),
    ],
)
def test_parse_name_reads_any_runtime_string(device, expected):
    assert parse_name(device) == expected


# ---- canonical forms -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "device",
    ["/GPU:0", "/device:GPU:0", "/job:localhost/replica:0/task:0/device:GPU:0", "/job:localhost/GPU:0"],
)
def test_local_job_spellings_share_one_canonical_form(device):
    assert normalize(device) == "/GPU:0"


def test_named_job_keeps_job_and_task_and_drops_the_replica():
    assert normalize("/job:worker/replica:0/task:1/device:CPU:2") == "/job:worker/task:1/CPU:2"


def test_canonical_form_of_unset_is_empty():
    assert normalize("") == ""


def test_split_prefix_separates_task_and_device():
    assert split_prefix("/job:worker/task:1/GPU:0") == ("/job:worker/task:1", "/GPU:0")


def test_local_name_is_the_device_within_its_task():
    assert local_name("/job:worker/replica:0/task:1/device:CPU:1") == "/CPU:1"


# ---- comparison ----------------------------------------------------------------------------


def test_matches_ignores_parts_the_plan_leaves_out():
    assert matches("/job:ps", "/job:ps/task:1/CPU:0")


def test_matches_equates_local_job_spellings():
    assert matches("/device:CPU:0", "/job:localhost/replica:0/task:0/device:CPU:0")


def test_matches_refuses_another_task():
    assert not matches("/job:worker/task:1/GPU:0", "/job:worker/task:0/GPU:0")


def test_sort_key_orders_local_devices_before_named_jobs_and_by_index():
    names = ["/job:worker/task:0/GPU:0", "/GPU:1", "/CPU:0", "/GPU:0"]
    assert sorted(names, key=sort_key) == ["/CPU:0", "/GPU:0", "/GPU:1", "/job:worker/task:0/GPU:0"]


# ---- the emulation mapping -----------------------------------------------------------------


def test_emulation_aliases_put_gpu_i_on_logical_cpu_i_plus_one():
    assert emulation_aliases([0, 1]) == ALIASES


def _dm() -> DeviceMap:
    return DeviceMap(aliases=dict(ALIASES), replica_devices=("/CPU:1", "/CPU:2"),
                     spec_replica_devices=("/GPU:0", "/GPU:1"), emulated=True)


def test_physical_keeps_the_callers_format():
    assert _dm().physical("/job:worker/task:1/device:GPU:1") == "/job:worker/task:1/CPU:2"


def test_spec_keeps_the_callers_format():
    assert _dm().spec("/job:localhost/replica:0/task:0/device:CPU:2") == "/job:localhost/replica:0/task:0/device:GPU:1"


def test_spec_leaves_the_host_alone():
    assert _dm().spec("/CPU:0") == "/CPU:0"


def test_canonical_spec_of_a_runtime_name():
    assert _dm().canonical_spec("/job:localhost/replica:0/task:0/device:CPU:2") == "/GPU:1"


def test_canonical_spec_keeps_a_named_job():
    assert _dm().canonical_spec("/job:worker/replica:0/task:1/device:CPU:1") == "/job:worker/task:1/GPU:0"


def test_canonical_spec_of_unset_is_empty():
    assert _dm().canonical_spec("") == ""


def test_canonical_physical_of_a_spec_name():
    assert _dm().canonical_physical("/device:GPU:1") == "/CPU:2"


def test_canonical_physical_ignores_fallbacks():
    dm = DeviceMap(aliases={}, replica_devices=("/CPU:0",), spec_replica_devices=("/GPU:0",),
                   fallbacks={"/GPU:0": "/CPU:0"})
    assert dm.canonical_physical("/GPU:0") == "/GPU:0"


def test_physical_and_spec_round_trip_every_alias():
    dm = _dm()
    assert {s: dm.spec(dm.physical(s)) for s in ALIASES} == {s: s for s in ALIASES}


def test_of_returns_a_device_map_unchanged():
    dm = _dm()
    assert DeviceMap.of(dm) is dm


def test_of_builds_the_mapping_from_any_object_with_aliases():
    other = type("DM", (), {"aliases": dict(ALIASES)})()
    assert DeviceMap.of(other).canonical_spec("/CPU:1") == "/GPU:0"


def test_of_none_maps_nothing():
    assert DeviceMap.of(None).canonical_spec("/job:localhost/replica:0/task:0/device:CPU:1") == "/CPU:1"


def test_module_does_not_import_tensorflow():
    code = "import sys, pinpoint.device_names; print('tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
