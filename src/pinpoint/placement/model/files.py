"""placement.json and placement_ops.json.gz: writing them, and the one way to read them back.

placement.json holds what the report's sections and MLflow's metrics need (under 300 KB for
ResNet50 on 4 GPUs); the per-op list (`ops`), every transfer of the first captured step
(`transfer_items`), the variables' fingerprints and the memory prediction's replay
(`memory.predicted.replay`, what `pinpoint plan` replays per placement) go to the gzipped file beside it, named after
it (placement.json -> placement_ops.json.gz, placement-worker-0.json ->
placement-worker-0_ops.json.gz). `read_placement` joins them again and `load_placement` reads them as
the model (placement.model.Placement: the report, merge, planner, compare and MLflow use it; nothing
else opens the files); a placement.json written before the split,
with `ops` inside, reads the same, and one of an older schema version reads in the current one
(placement.model.upgrade).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from pinpoint.errors import ConfigError
from pinpoint.placement.model.placement import Placement, upgrade
from pinpoint.runfolder import PLACEMENT, atomic_write_bytes, atomic_write_text

DETAIL_KEYS = ("ops", "transfer_items")


REPLAY = "memory_replay"  # placement.json's memory.predicted.replay, kept in the per-op file


OPS_SUFFIX = "_ops.json.gz"


def ops_path(path: str | Path) -> Path:
    """The per-op file beside a placement file."""
    p = Path(path)
    return p.with_name(p.name.removesuffix(".json") + OPS_SUFFIX)


def split_placement(content: dict[str, Any]) -> tuple[dict, dict]:
    """(placement.json's content, the per-op file's content) from the whole placement's content."""
    main = {k: v for k, v in content.items() if k not in DETAIL_KEYS}
    detail = {k: content[k] for k in DETAIL_KEYS if k in content}
    prints = {}
    if content.get("variables"):
        main["variables"] = []
        for v in content["variables"]:
            if "fingerprint" in v:
                prints[v["name"]] = v["fingerprint"]
            main["variables"].append({k: x for k, x in v.items() if k != "fingerprint"})
    if prints:
        detail["fingerprints"] = prints
    predicted = (main.get("memory") or {}).get("predicted") or {}
    if "replay" in predicted:  # the memory prediction's replay (pinpoint plan replays it per placement)
        main["memory"] = dict(main["memory"], predicted={k: v for k, v in predicted.items() if k != "replay"})
        detail[REPLAY] = predicted["replay"]
    return main, detail


def join_placement(main: dict[str, Any], detail: dict[str, Any] | None) -> dict[str, Any]:
    """The whole placement from its two parts (detail None: placement.json alone)."""
    if not detail:
        return main
    out = dict(main, **{k: detail[k] for k in DETAIL_KEYS if k in detail})
    if REPLAY in detail and (main.get("memory") or {}).get("predicted"):
        out["memory"] = dict(main["memory"], predicted=dict(main["memory"]["predicted"], replay=detail[REPLAY]))
    prints = detail.get("fingerprints") or {}
    if prints and out.get("variables"):
        out["variables"] = [dict(v, fingerprint=prints[v["name"]]) if v["name"] in prints else v
                            for v in out["variables"]]
    return out


def write_placement(path: str | Path, placement: Placement | dict[str, Any]) -> Path:
    """Write placement.json and its per-op file; the per-op file first, so whoever sees
    placement.json finds both."""
    main, detail = split_placement(placement.to_json() if isinstance(placement, Placement) else placement)
    detail_json = json.dumps(detail, separators=(",", ":"), default=str).encode()
    atomic_write_bytes(ops_path(path), gzip.compress(detail_json, mtime=0))
    # One section per line, each compact: a ResNet50 on 4 GPUs stays under 300 KB (indented, the
    # variables' component lists alone would take 230 KB), and a diff still shows which changed.
    lines = [f"  {json.dumps(k)}: {json.dumps(v, separators=(',', ':'), default=str)}" for k, v in main.items()]
    return atomic_write_text(path, "{\n" + ",\n".join(lines) + "\n}\n")


def read_placement(path: str | Path, *, detail: bool = True, field: str = "run_dir") -> dict[str, Any]:
    """placement.json (a file, or the run folder holding it) joined with its per-op file when
    `detail` and the file exists."""
    p = Path(path)
    if p.is_dir():
        p = p / PLACEMENT
    if not p.is_file():
        raise ConfigError(f"{field}: got '{p}', which does not exist; run the previous step first (see `make help`)")
    main = json.loads(p.read_text())
    if not isinstance(main, dict):
        return main
    main = upgrade(main)  # an older schema reads as the current one
    ops = ops_path(p)
    if not detail or not ops.is_file():
        return main
    with gzip.open(ops, "rb") as f:
        return join_placement(main, json.loads(f.read()))


def load_placement(path: str | Path, *, detail: bool = True, field: str = "run_dir") -> Placement:
    """The placement model of placement.json (read_placement's content, see there)."""
    content = read_placement(path, detail=detail, field=field)
    if not isinstance(content, dict):
        raise ConfigError(f"{field}: got '{path}', whose {PLACEMENT} is not a placement file; re-run `pinpoint train` "
                          "with placement.enabled: true")
    return Placement.from_json(content)
