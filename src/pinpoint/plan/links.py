"""The link model: what moving bytes between two devices costs, latency_us + bytes / bandwidth.

One link per device-pair kind, the kind read from the two device strings:
- same: one device, or two CPU devices of one task (one host memory; TensorFlow hands tensors
  between them by reference) — free;
- network: the two devices are in different tasks (job or task differ);
- pcie: host CPU <-> GPU of one task, and GPU <-> GPU unless the user says the GPUs are NVLinked;
- nvlink: GPU <-> GPU of one task when `gpu_gpu: nvlink`.

Defaults (overridable per kind, see LinkModel.from_dict), chosen as effective, not peak, figures:
- pcie: PCIe 3.0 x16 is 15.75 GB/s raw; cudaMemcpy reaches ~12 GB/s pinned; ~10 us per copy
  (launch + DMA setup).
- nvlink: NVLink 2.0 is 25 GB/s per link per direction; V100 pairs in a DGX-1 have 1-2 links,
  so 40 GB/s (A100 NVLink 3 pairs reach ~150 GB/s: override); ~5 us per copy.
- network: 10 GbE is 1.25 GB/s on the wire, ~1.1 GB/s through gRPC; ~50 us per message
  (a TCP round trip in one rack). For 25 GbE use gb_per_s: 2.8.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from pinpoint.device_names import parse_name
from pinpoint.errors import ConfigError

KINDS = ("pcie", "nvlink", "network")


@dataclass(frozen=True)
class Link:
    """One kind of link: a fixed cost per transfer plus bytes over the bandwidth."""

    latency_us: float
    gb_per_s: float

    def transfer_us(self, nbytes: int) -> float:
        # GB/s = 1e9 bytes/s = 1e3 bytes/us.
        return 0.0 if nbytes <= 0 else self.latency_us + nbytes / (self.gb_per_s * 1e3)


@dataclass(frozen=True)
class LinkModel:
    """The links of a cluster; `gpu_gpu` says which link joins two GPUs of one task."""

    pcie: Link = field(default_factory=lambda: Link(latency_us=10.0, gb_per_s=12.0))
    nvlink: Link = field(default_factory=lambda: Link(latency_us=5.0, gb_per_s=40.0))
    network: Link = field(default_factory=lambda: Link(latency_us=50.0, gb_per_s=1.1))
    gpu_gpu: str = "pcie"

    def kind(self, a: str, b: str) -> str:
        """'same', 'pcie', 'nvlink' or 'network' for the pair of device strings a, b."""
        if a == b:
            return "same"
        ja, ta, da, _ = parse_name(a)
        jb, tb, db, _ = parse_name(b)
        if (ja, ta) != (jb, tb):
            return "network"
        if da == "GPU" and db == "GPU":
            return self.gpu_gpu
        if da == "GPU" or db == "GPU":
            return "pcie"
        return "same"  # two CPU devices of one process share its memory

    def transfer_us(self, a: str, b: str, nbytes: int) -> float:
        kind = self.kind(a, b)
        return 0.0 if kind == "same" else getattr(self, kind).transfer_us(nbytes)

    def to_dict(self) -> dict[str, Any]:
        return {**{k: asdict(getattr(self, k)) for k in KINDS}, "gpu_gpu": self.gpu_gpu}

    @classmethod
    def from_dict(cls, data: Any, field_name: str = "links") -> LinkModel:
        """Defaults overridden by `{pcie: {latency_us: .., gb_per_s: ..}, ..., gpu_gpu: nvlink}`;
        a bad entry is one ConfigError line naming it."""
        model = cls()
        if data is None:
            return model
        if not isinstance(data, dict):
            raise ConfigError(f"{field_name}: got {data!r}; write a mapping such as {{pcie: {{gb_per_s: 12}}}}")
        for key, value in data.items():
            where = f"{field_name}.{key}"
            if key == "gpu_gpu":
                if value not in ("pcie", "nvlink"):
                    raise ConfigError(f"{where}: got {value!r}; use pcie or nvlink")
                model = replace(model, gpu_gpu=value)
                continue
            if key not in KINDS:
                raise ConfigError(f"{where}: got an unknown link kind; use one of {', '.join(KINDS)}, gpu_gpu")
            if not isinstance(value, dict):
                raise ConfigError(f"{where}: got {value!r}; write {{latency_us: .., gb_per_s: ..}}")
            link = getattr(model, key)
            for name, number in value.items():
                if name not in ("latency_us", "gb_per_s"):
                    raise ConfigError(f"{where}.{name}: got an unknown field; use latency_us or gb_per_s")
                if isinstance(number, bool) or not isinstance(number, (int, float)):
                    raise ConfigError(f"{where}.{name}: got {number!r}; pass a number")
                if name == "gb_per_s" and not number > 0:
                    raise ConfigError(f"{where}.{name}: got {number}; pass a bandwidth > 0 (GB/s)")
                if name == "latency_us" and not number >= 0:
                    raise ConfigError(f"{where}.{name}: got {number}; pass a latency >= 0 (microseconds)")
                link = replace(link, **{name: float(number)})
            model = replace(model, **{key: link})
        return model


def load_links(path: str | None) -> LinkModel:
    """The link model of a YAML file (its `links:` section, or the file is the section); the
    defaults when path is None."""
    if path is None:
        return LinkModel()
    from pathlib import Path

    import yaml

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"--links: got '{p}', which does not exist; pass a YAML file with a links: section")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"--links: got '{p}', which is not YAML ({str(err).splitlines()[0]}); fix the file") from None
    if isinstance(data, dict) and "links" in data:
        data = data["links"]
    return LinkModel.from_dict(data)
