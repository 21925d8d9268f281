"""The digits data set that ships with Pinpoint (the demo's `train.data: digits` and the examples'):
1,797 8x8 images of handwritten digits, pixel counts 0..16, labelled 0..9. It is the test set of the
UCI "Optical Recognition of Handwritten Digits" data set (E. Alpaydin, C. Kaynak, 1998; CC BY 4.0),
in the file scikit-learn ships it as (digits.csv.gz, BSD-3-Clause). Pinpoint carries its own copy
so that scikit-learn is not in the environment: Keras imports it, and SciPy with it, at every
`import tensorflow` when it is installed (about 1.7 CPU s of each start-up)."""

from __future__ import annotations

import gzip
from importlib import resources

import numpy as np


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """(x, y): the images flattened to float64 (1797, 64) and their labels as int (1797,), the
    arrays of scikit-learn's `load_digits(return_X_y=True)`."""
    with resources.files(__package__).joinpath("digits.csv.gz").open("rb") as raw, gzip.open(raw, "rt") as f:
        data = np.loadtxt(f, delimiter=",")
    return data[:, :-1], data[:, -1].astype(int)
