"""A device's memory size as a user writes it ('16GiB', '80 GB'), parsed once for the CLI and the config."""

from __future__ import annotations

import re

from pinpoint.errors import ConfigError

UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
         "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]+)\s*$")
CONTEXT = 512 * 2**20  # the CUDA context, cuBLAS and cuDNN handles: outside TensorFlow's allocator


def parse_size(text: str, field: str) -> int:
    """Bytes of '16GiB', '80 GB', '512MiB' (B, KB, MB, GB, TB and KiB, MiB, GiB, TiB)."""
    m = _SIZE.match(str(text))
    unit = m.group(2).upper() if m else ""
    if not m or unit not in UNITS:
        raise ConfigError(f"{field}: got {text!r}; pass a size with a unit, e.g. 16GiB or 80GB "
                          "(units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)")
    size = int(float(m.group(1)) * UNITS[unit])
    if size <= CONTEXT:
        raise ConfigError(f"{field}: got {text!r}, no more than the {CONTEXT // 2**20} MiB a CUDA context takes "
                          "before TensorFlow allocates anything; pass the GPU's memory, e.g. 16GiB")
    return size
