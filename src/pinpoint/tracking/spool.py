"""The write-ahead spool of one MLflow run: every record is appended here first, then sent.

Layout of a spool folder (`<run_dir>/.mlflow-spool/<step>-<local_id>/`):
  meta.json      tracking URI, experiment, run name, parent, local id, server run id once created
  journal.jsonl  one JSON record per line (create_run, params, tags, metrics, artifact, end_run)
                 (a buffered spool keeps metric records in memory until the sender's next pass
                 or the next other record, e.g. a checkpoint: see `Spool.append`)
  acked.txt      ids of records the server has confirmed
  blobs/<id>/    snapshot (hard link or copy) of each logged file, so rotation or deletion of the
                 original (old checkpoints) cannot lose it before it is uploaded
  stage/<id>/    links to the blobs of one batched upload, laid out as the run's artifacts
A spool folder whose records are all acknowledged is removed; a leftover one is replayed by
`pinpoint upload-spool DIR`, idempotently (acks + server-side dedupe of (key, step)).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pinpoint.runfolder import atomic_write_json

SPOOL_DIR = ".mlflow-spool"
META = "meta.json"
JOURNAL = "journal.jsonl"
ACKED = "acked.txt"
BLOBS = "blobs"
STAGE = "stage"


def warn(msg: str) -> None:
    print(f"pinpoint: warning: {msg}", file=sys.stderr, flush=True)


class Spool:
    """Append-only journal + acks of one run. Appends are thread-safe and never touch the network."""

    def __init__(self, folder: str | Path, *, buffered: bool = False):
        self.folder = Path(folder)
        self.buffered = buffered
        self._lock = threading.Lock()
        self._seq = 0
        self._acked: set[str] = set()
        self._ids: set[str] = set()  # ids journaled or buffered: unacked = ids - acked
        self._buffer: list[dict[str, Any]] = []
        self._read_offset = 0
        if (self.folder / JOURNAL).exists():
            self._ids = {json.loads(line)["id"] for line in self._lines()}
            self._seq = len(self._ids)
        if (self.folder / ACKED).exists():
            self._acked = set((self.folder / ACKED).read_text().split())

    # ---- creation / metadata -------------------------------------------------------------
    @classmethod
    def create(cls, folder: str | Path, meta: dict[str, Any], *, buffered: bool = False) -> Spool:
        f = Path(folder)
        (f / BLOBS).mkdir(parents=True, exist_ok=True)
        atomic_write_json(f / META, meta)
        (f / JOURNAL).touch()
        return cls(f, buffered=buffered)

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
        """Journal one record. A buffered spool keeps metric records in memory (no disk write on
        the training thread per step); they reach the journal at the sender's next pass
        (`write_buffered`, every tracking.run.SEND_INTERVAL_S) or with the next other record,
        which is written through at once. A checkpoint's artifact record is such a record: a
        crash loses at most the metrics logged since the last checkpoint and the last pass,
        and a restart redoes (and logs again) every step after that checkpoint."""
        with self._lock:
            self._seq += 1
            record = {"id": f"{self.meta_local_id}:{self._seq}", "op": op, **fields}
            self._ids.add(record["id"])
            self._buffer.append(record)
            if not (self.buffered and op == "metrics"):
                self._write_locked()
        return record

    def write_buffered(self) -> None:
        """Write the buffered records to the journal in one append (the sender's thread)."""
        with self._lock:
            self._write_locked()

    def _write_locked(self) -> None:
        if not self._buffer:
            return
        text = "".join(json.dumps(r) + "\n" for r in self._buffer)
        self._buffer.clear()
        with open(self.folder / JOURNAL, "a") as f:
            f.write(text)

    @property
    def meta_local_id(self) -> str:
        if not hasattr(self, "_local_id"):
            self._local_id = self.meta["local_id"]
        return self._local_id

    def blob_dir(self, record_id: str) -> Path:
        return self.folder / BLOBS / record_id.replace(":", "_")

    def stage_dir(self) -> Path:
        """A fresh folder under stage/ for one batched upload (the sender removes it after)."""
        return self.folder / STAGE / uuid.uuid4().hex[:12]

    def snapshot(self, record_id: str, src: Path) -> Path:
        """Hard-link (or copy) `src` (file or folder) under blobs/<id>/; returns the snapshot path."""
        dest = self.blob_dir(record_id) / src.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dest, copy_function=link_or_copy)
        else:
            link_or_copy(src, dest)
        return dest

    def _lines(self) -> Iterator[str]:
        with open(self.folder / JOURNAL) as f:
            for line in f:
                if line.endswith("\n"):
                    yield line

    def read_new(self) -> list[dict[str, Any]]:
        """Complete records appended since the last call (the sender's cursor); buffered records
        are journaled first, so nothing is sent that is not on disk."""
        self.write_buffered()
        out = []
        with open(self.folder / JOURNAL) as f:
            f.seek(self._read_offset)
            while True:
                line = f.readline()
                if not line.endswith("\n"):
                    break  # a half-written line: read it next time
                self._read_offset += len(line.encode())
                out.append(json.loads(line))
                self._ids.add(out[-1]["id"])  # another process's journal (process.py) grows
        return out

    def pending(self) -> list[dict[str, Any]]:
        """All records not acknowledged yet, in order (for a replay in a new process)."""
        return [r for r in self.records() if r["id"] not in self._acked]

    def rewind(self) -> None:
        """Move the sender's cursor back to the journal's start: the next `read_new` returns
        every journaled record again."""
        self._read_offset = 0

    def records(self) -> list[dict[str, Any]]:
        """Every journaled record from the start; the sender's cursor then stands at the end."""
        self.rewind()
        return self.read_new()

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

    def count(self) -> int:
        """Records appended by this object or read from the journal."""
        with self._lock:
            return len(self._ids)

    def unacked_count(self) -> int:
        with self._lock:
            return len(self._ids - self._acked)

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
        parent = self.folder.parent
        if parent.name == SPOOL_DIR and parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()


def link_or_copy(src, dst) -> str:
    """Hard-link src at dst (no bytes copied), or copy it where links cannot be made."""
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
