"""The registry of flavours: cluster.flavor -> its class's instance, and the workload kind -> the
same instance (the launch step knows a run folder by its manifests' kinds)."""

from __future__ import annotations

from pinpoint.config import Config
from pinpoint.errors import ProvisionError
from pinpoint.provision.flavour import Flavour
from pinpoint.provision.jobset import JobSetFlavour
from pinpoint.provision.plain import PlainFlavour
from pinpoint.provision.tfjob import TFJobFlavour
from pinpoint.provision.trainjob import TrainJobFlavour

FLAVOURS: dict[str, Flavour] = {f.name: f for f in (TFJobFlavour(), PlainFlavour(), JobSetFlavour(), TrainJobFlavour())}
BY_KIND: dict[str, Flavour] = {f.kind: f for f in FLAVOURS.values()}
WORKLOAD_KINDS = tuple(BY_KIND)


def flavour_of(cfg: Config) -> Flavour:
    """The flavour of cfg.cluster.flavor (config.py admits only registered names)."""
    return FLAVOURS[cfg.cluster.flavor]


def flavour_of_docs(docs: list[dict]) -> Flavour:
    """The flavour whose workload the manifests hold; ProvisionError when none or two do."""
    found = {BY_KIND[d["kind"]].name for d in docs if d.get("kind") in BY_KIND}
    if len(found) != 1:
        raise ProvisionError(f"manifests: got workloads of flavours {sorted(found)}; expected exactly one of "
                             f"{list(FLAVOURS)}; rerun provision into an empty folder")
    return FLAVOURS[found.pop()]
