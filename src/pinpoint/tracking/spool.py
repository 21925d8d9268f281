"""The write-ahead spool of one MLflow run: every record is appended here first, then sent.

Layout of a spool folder (`<run_dir>/.mlflow-spool/<step>-<local_id>/`):
  meta.json      tracking URI, experiment, run name, parent, local id, server run id once created
  journal.jsonl  one JSON record per line (create_run, params, tags, metrics, artifact, end_run)
  acked.txt      ids of records the server has confirmed
  blobs/<id>/    snapshot (hard link or copy) of each logged file, so rotation or deletion of the
                 original (old checkpoints) cannot lose it before it is uploaded
A spool folder whose records are all acknowledged is removed; a leftover one is replayed by
`pinpoint upload-spool DIR`, idempotently (acks + server-side dedupe of (key, step)).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pinpoint.errors import ConfigError
from pinpoint.runfolder import atomic_write_json

SPOOL_DIR = ".mlflow-spool"
META = "meta.json"
JOURNAL = "journal.jsonl"
ACKED = "acked.txt"
BLOBS = "blobs"


def warn(msg: str) -> None:
    print(f"pinpoint: warning: {msg}", file=sys.stderr, flush=True)


class Spool:
    """Append-only journal + acks of one run. Appends are thread-safe and never touch the network."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self._lock = threading.Lock()
        self._seq = 0
        self._acked: set[str] = set()
        self._read_offset = 0
        if (self.folder / JOURNAL).exists():
            self._seq = sum(1 for _ in self._lines())
        if (self.folder / ACKED).exists():
            self._acked = set((self.folder / ACKED).read_text().split())

    # ---- creation / metadata -------------------------------------------------------------
    @classmethod
    def create(cls, folder: str | Path, meta: dict[str, Any]) -> Spool:
        f = Path(folder)
        (f / BLOBS).mkdir(parents=True, exist_ok=True)
        atomic_write_json(f / META, meta)
        (f / JOURNAL).touch()
        return cls(f)

    @property
    def meta(self) -> dict[str, Any]:
        return json.loads((self.folder / META).read_text())

    def update_meta(self, **changes: Any) -> None:
        with self._lock:
            meta = self.meta
            meta.update(changes)
            atomic_write_json(self.folder / META, meta)

    # ---- journal -------------------------------------------------------------------------
    def append(self, op: str, **fields: Any) -> dict[str, Any]:
        with self._lock:
            self._seq += 1
            record = {"id": f"{self.meta_local_id}:{self._seq}", "op": op, **fields}
            with open(self.folder / JOURNAL, "a") as f:
                f.write(json.dumps(record) + "\n")
                f.flush()
        return record

    @property
    def meta_local_id(self) -> str:
        if not hasattr(self, "_local_id"):
            self._local_id = self.meta["local_id"]
        return self._local_id

    def blob_dir(self, record_id: str) -> Path:
        return self.folder / BLOBS / record_id.replace(":", "_")

    def snapshot(self, record_id: str, src: Path) -> Path:
        """Hard-link (or copy) `src` (file or folder) under blobs/<id>/; returns the snapshot path."""
        dest = self.blob_dir(record_id) / src.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dest, copy_function=_link_or_copy)
        else:
            _link_or_copy(src, dest)
        return dest

    def _lines(self) -> Iterator[str]:
        with open(self.folder / JOURNAL) as f:
            for line in f:
                if line.endswith("\n"):
                    yield line

    def read_new(self) -> list[dict[str, Any]]:
        """Complete records appended since the last call (the sender's cursor)."""
        out = []
        with open(self.folder / JOURNAL) as f:
            f.seek(self._read_offset)
            while True:
                line = f.readline()
                if not line.endswith("\n"):
                    break  # a half-written line: read it next time
                self._read_offset += len(line.encode())
                out.append(json.loads(line))
        return out

    def pending(self) -> list[dict[str, Any]]:
        """All records not acknowledged yet, in order (for a replay in a new process)."""
        self._read_offset = 0
        return [r for r in self.read_new() if r["id"] not in self._acked]

    # ---- acks ----------------------------------------------------------------------------
    def ack(self, records: list[dict[str, Any]]) -> None:
        ids = [r["id"] for r in records]
        with self._lock:
            with open(self.folder / ACKED, "a") as f:
                f.write("".join(i + "\n" for i in ids))
            self._acked.update(ids)
        for r in records:
            if r["op"] == "artifact":
                shutil.rmtree(self.blob_dir(r["id"]), ignore_errors=True)

    def is_acked(self, record_id: str) -> bool:
        return record_id in self._acked

    def unacked_count(self) -> int:
        return sum(1 for line in self._lines() if json.loads(line)["id"] not in self._acked)

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
        parent = self.folder.parent
        if parent.name == SPOOL_DIR and parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()


def _link_or_copy(src, dst) -> str:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
    return str(dst)


def find_spools(folder: str | Path) -> list[Path]:
    """Spool folders in `folder`: itself, <folder>/.mlflow-spool/*, or <folder>/* holding a journal."""
    f = Path(folder)
    if (f / JOURNAL).is_file():
        return [f]
    found = sorted(p.parent for p in f.glob(f"{SPOOL_DIR}/*/{JOURNAL}"))
    found += sorted(p.parent for p in f.glob(f"*/{JOURNAL}"))
    found += sorted(p.parent for p in f.glob(f"*/{SPOOL_DIR}/*/{JOURNAL}"))
    return sorted(set(found), key=lambda p: (p / META).stat().st_mtime if (p / META).exists() else 0)


def upload_spool_command(folder: str | Path, uri: str | None = None) -> int:
    """`pinpoint upload-spool DIR [--uri]`: replay leftover spools; 0 when everything arrived."""
    from pinpoint.tracking.sender import replay

    f = Path(folder)
    if not f.is_dir():
        raise ConfigError(f"upload-spool: DIR '{f}' is not a folder; pass a run folder such as runs/demo")
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
