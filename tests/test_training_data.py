"""Data sources: digits, synthetic, .npz and .csv files, with one-line errors."""

import numpy as np
import pytest

from pinpoint.errors import ConfigError
from pinpoint.training.input.data import load_arrays, synthetic
from tests.conftest import make_config

pytestmark = pytest.mark.unit


def _cfg(**train):
    return make_config("d", train=train)


def test_digits_are_bundled_and_scaled():
    a = load_arrays(_cfg(data="digits"))
    assert a.x.shape == (1797, 64) and a.x.dtype == np.float32
    assert 0.0 <= a.x.min() and a.x.max() <= 1.0
    assert a.num_classes == 10


def test_synthetic_has_the_requested_size_and_is_fixed():
    a = load_arrays(_cfg(data="synthetic", synthetic_examples=300))
    b = synthetic(300)
    assert a.x.shape == (300, 64)
    np.testing.assert_array_equal(a.x, b.x)
    assert len(set(a.y.tolist())) > 3  # a learnable problem with several classes


def test_npz_file(tmp_path):
    p = tmp_path / "d.npz"
    np.savez(p, x=np.ones((5, 2, 2)), y=np.array([0, 1, 2, 1, 0]))
    a = load_arrays(_cfg(data=str(p)))
    assert a.x.shape == (5, 4) and a.num_classes == 3


def test_npz_without_x_and_y(tmp_path):
    p = tmp_path / "d.npz"
    np.savez(p, features=np.ones((5, 2)))
    with pytest.raises(ConfigError, match="train.data: .* not 'x' and 'y'"):
        load_arrays(_cfg(data=str(p)))


def test_csv_with_label_column(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text("a,target,b\n1,0,2\n3,1,4\n5,1,6\n")
    a = load_arrays(_cfg(data=str(p), label_column="target"))
    np.testing.assert_array_equal(a.x, [[1, 2], [3, 4], [5, 6]])
    np.testing.assert_array_equal(a.y, [0, 1, 1])


def test_csv_missing_label_column_names_field_columns_and_fix(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text("a,b\n1,2\n")
    with pytest.raises(ConfigError) as err:
        load_arrays(_cfg(data=str(p)))
    msg = str(err.value)
    assert "train.label_column: got 'label', which is not among" in msg and "['a', 'b']" in msg and "set label_column" in msg
    assert "\n" not in msg


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="train.data: got '.*', which does not exist"):
        load_arrays(_cfg(data=str(tmp_path / "nope.csv")))


def test_each_epoch_is_a_seeded_permutation_and_any_range_is_known_without_replay():
    from pinpoint.training.input.data import EpochOrder

    order = EpochOrder(7, seed=3)
    stream = order.indices(0, 7 * 4)  # four epochs from the start
    assert [sorted(stream[e * 7:(e + 1) * 7].tolist()) for e in range(4)] == [list(range(7))] * 4
    assert stream[:7].tolist() != stream[7:14].tolist()  # each epoch its own order
    # A range that starts mid-epoch and spans three epochs, from a fresh order (a resumed run):
    assert EpochOrder(7, seed=3).indices(5, 16).tolist() == stream[5:21].tolist()
    assert EpochOrder(7, seed=4).indices(0, 7).tolist() != stream[:7].tolist()
