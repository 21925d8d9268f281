"""Sending what a journal still holds after its writer is gone: `pinpoint upload-spool` (any
spool, any time) and the adoption of a restarted chief's predecessor's spool (its run ends KILLED)."""

from __future__ import annotations

from pathlib import Path

from pinpoint.errors import ConfigError
from pinpoint.tracking.sender import Sender, now_ms
from pinpoint.tracking.spool import SPOOL_DIR, Spool, find_spools, warn
from pinpoint.tracking.uri import redact


def replay(spool: Spool, uri: str | None = None) -> tuple[bool, int, str | None]:
    """Send every unacknowledged record of `spool` now (upload-spool); (all sent?, count, run id)."""
    sender = Sender(spool, uri=uri, replay=True)
    if uri:
        spool.update_meta(uri=redact(uri))
    ok = sender.drain_once() if sender.pending else True
    return ok, sender.sent, sender.run_id


def adopt_spool(folder: Path) -> None:
    """Replay an orphaned spool (its writer is gone) and end its run KILLED."""
    spool = Spool(folder)
    if not _has_end(spool):
        spool.append("end_run", status="KILLED", end_time=now_ms())
    ok, sent, run_id = replay(spool)
    if ok:
        spool.remove()
        warn(f"sent {sent} MLflow record(s) left by an earlier process to run {run_id}")


def _has_end(spool: Spool) -> bool:
    return any(r["op"] == "end_run" for r in spool.records())


def upload_spool_command(folder: str | Path, uri: str | None = None) -> int:
    """`pinpoint upload-spool DIR [--uri]`: replay leftover spools; 0 when everything arrived."""
    f = Path(folder)
    if not f.is_dir():
        raise ConfigError(f"upload-spool DIR: got '{f}', which is not a folder; pass a run folder such as runs/demo")
    spools = find_spools(f)
    if not spools:
        print(f"pinpoint: nothing to upload in {f} (no {SPOOL_DIR}/ with pending records)")
        return 0
    failed = 0
    for folder_ in spools:
        spool = Spool(folder_)
        ok, sent, run_id = replay(spool, uri=uri)
        if ok:
            print(f"pinpoint: uploaded {sent} record(s) of {folder_.name} to run {run_id}")
            spool.remove()
        else:
            failed += 1
            warn(f"{folder_}: {spool.unacked_count()} record(s) still pending; is the server up? "
                 "rerun `pinpoint upload-spool` later")
    return 1 if failed else 0
