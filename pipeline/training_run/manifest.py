"""A checkpoint's manifest: every file it holds, with its size and SHA-256, written last.

A checkpoint directory that looks complete is not necessarily whole: a file truncated by a full disk or a
copy, a disk that lost what was never written back, a restore from a partial backup. Loading such a file fails
deep in a library (`SafetensorError: invalid header length`) naming neither the checkpoint nor the file, or,
worse, loads wrong numbers. So each checkpoint carries `manifest.json`, written after every other file is on
the disk (fsynced), and a resume checks it before it trusts the directory (`problem`):

1. the manifest is there, readable and byte for byte as written (its absence means the save never finished: a
   kill, or a checkpoint written before manifests existed);
2. every listed file is there with the listed size (cheap; catches truncation);
3. every file's header loads: a safetensors header and its offsets, the zip directory of a torch file;
4. every file's SHA-256 is the listed one (catches any change of bytes; ~1.7 GB/s here, so ~1 s for
   SmolLM2-135M's model and optimiser state).

A verdict is remembered for the life of the process, keyed by each file's inode, size and modification time,
so the stage's decision and the trainer's load hash a checkpoint once. As git does for its index ("racy clean"),
a verdict on files modified within `RACY_S` of the check is not remembered: a change within the same tick of
the file system's clock would leave the key as it was.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from safetensors import SafetensorError, safe_open

from pipeline.outputs import write_durably

MANIFEST = "manifest.json"
VERSION = 1
_CHUNK = 1 << 24
RACY_S = 2.0  # coarser than any file system's timestamp granularity (ext4: a jiffy; FAT: 2 s)


@dataclass(frozen=True)
class FileRecord:
    size: int  # bytes
    sha256: str  # hex


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST and not p.name.endswith(".tmp"))


def _manifest_text(records: dict[str, FileRecord]) -> str:
    """The one way a manifest is written: `read_manifest` refuses any other bytes, so it verifies itself too."""
    return json.dumps({"version": VERSION, "files": {name: {"size": r.size, "sha256": r.sha256}
                                                    for name, r in sorted(records.items())}}, indent=2) + "\n"


def write_manifest(folder: Path) -> dict[str, FileRecord]:
    """Record every file under `folder` (read back from the disk), then write the manifest durably: call it
    once every file is written and fsynced, as the checkpoint's last write."""
    records = {p.relative_to(folder).as_posix(): FileRecord(p.stat().st_size, file_sha256(p)) for p in _files(folder)}
    write_durably(folder / MANIFEST, _manifest_text(records))
    return records


def read_manifest(folder: Path) -> dict[str, FileRecord]:
    """The manifest's records; ValueError naming what is wrong with it."""
    try:
        text = (folder / MANIFEST).read_text(encoding="utf-8")
        files = json.loads(text)["files"]
        records = {str(name): FileRecord(int(r["size"]), str(r["sha256"])) for name, r in files.items()}
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"{MANIFEST} is not a manifest ({type(err).__name__}: {err})") from None
    if text != _manifest_text(records):
        raise ValueError(f"{MANIFEST} is not as it was written (its bytes changed)")
    return records


def _header_problem(path: Path) -> str | None:
    """Why a weights or torch file's header does not load (None when it does); the data itself is the digest's."""
    if path.suffix == ".safetensors":
        try:
            with safe_open(str(path), framework="pt") as fh:
                fh.keys()
        except (SafetensorError, OSError) as err:
            return f"not a loadable safetensors file ({type(err).__name__}: {err})"
    elif path.suffix in (".pt", ".bin"):
        try:
            with zipfile.ZipFile(path) as archive:
                archive.namelist()
        except (zipfile.BadZipFile, OSError) as err:
            return f"not a loadable torch file ({err})"
    return None


def _stat_key(folder: Path, names: list[str]) -> tuple[tuple, int]:
    """(the key a verdict is remembered under, the newest modification time in ns)."""
    stats = [os.stat(folder / name) for name in [MANIFEST, *names]]
    key = (str(folder.resolve()), *((s.st_ino, s.st_size, s.st_mtime_ns) for s in stats))
    return key, max(s.st_mtime_ns for s in stats)


_verdicts: dict[tuple, str | None] = {}


def problem(folder: Path, *, digests: bool = True) -> str | None:
    """Why the checkpoint in `folder` is not whole (one phrase naming the file), or None when it verifies.
    Without `digests`: the manifest, sizes and headers only (what a data-parallel rank checks before it loads
    a checkpoint the stage verified)."""
    if not (folder / MANIFEST).is_file():
        return f"no {MANIFEST} (its save never finished: killed while saving, or saved by an older version)"
    try:
        records = read_manifest(folder)
    except ValueError as err:
        return str(err)
    for name, record in records.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        size = path.stat().st_size
        if size != record.size:
            return f"{name} holds {size} bytes, the manifest says {record.size}"
    started = time.time_ns()
    key, newest = _stat_key(folder, list(records))
    key = (key, digests)
    if key in _verdicts:
        return _verdicts[key]
    verdict = next((f"{name}: {why}" for name in records if (why := _header_problem(folder / name))), None)
    if verdict is None and digests:
        verdict = next((f"{name}: its SHA-256 is not the manifest's (the bytes changed after it was written)"
                        for name, record in records.items() if file_sha256(folder / name) != record.sha256), None)
    if newest < started - int(RACY_S * 1e9):
        _verdicts[key] = verdict
    return verdict
