"""Every writer of outputs is durable: the new data reaches the disk before the rename that publishes it, and the
folder's new entry after (a rename alone survives a killed process, not a power cut: `pipeline.outputs`).

The property is checked on the order of the system calls, recorded by wrapping `os.fsync` and `os.replace`: for each
writer, the file (or every file of a published tree) is fsynced before the `replace` that names it, and the folder
holding the final name is fsynced after it."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline import jsonl, outputs


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """("fsync", the path the descriptor names) and ("replace", the destination), in the order they happened."""
    seen: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        seen.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src: str | os.PathLike, dst: str | os.PathLike) -> None:
        seen.append(("replace", str(Path(dst).resolve())))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return seen


WRITERS: dict[str, Callable[[Path], None]] = {
    "outputs.write_durably": lambda p: outputs.write_durably(p, "data"),
    "outputs.write_json_durably": lambda p: outputs.write_json_durably(p, {"a": 1}),
    "jsonl.write_json": lambda p: jsonl.write_json(p, {"a": 1}),
    "jsonl.write_json_lines": lambda p: jsonl.write_json_lines(p, [{"a": 1}, {"b": 2}]),
}


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_a_file_is_on_disk_before_its_rename_and_its_folder_after(writer: str, tmp_path: Path,
                                                                  calls: list[tuple[str, str]]) -> None:
    final = (tmp_path / "out" / "metrics.json").resolve()
    WRITERS[writer](final)
    renamed = calls.index(("replace", str(final)))
    before, after = calls[:renamed], calls[renamed + 1:]
    assert any(kind == "fsync" and path.startswith(str(final)) for kind, path in before), calls
    assert ("fsync", str(final.parent)) in after, calls


def test_a_published_tree_is_on_disk_before_its_rename(tmp_path: Path, calls: list[tuple[str, str]]) -> None:
    final = (tmp_path / "model").resolve()
    staging = outputs.staging_dir(final)
    (staging / "sub").mkdir(parents=True)
    for name in ("a.safetensors", "sub/b.json"):
        (staging / name).write_text(name)
    outputs.publish_dir(staging, final)
    renamed = calls.index(("replace", str(final)))
    flushed = {path for kind, path in calls[:renamed] if kind == "fsync"}
    assert {str(staging / "a.safetensors"), str(staging / "sub" / "b.json"), str(staging / "sub")} <= flushed
    assert ("fsync", str(final.parent)) in calls[renamed + 1:]


def test_an_appended_log_is_on_disk_when_the_call_returns(tmp_path: Path, calls: list[tuple[str, str]]) -> None:
    log = (tmp_path / "history.jsonl").resolve()
    outputs.append_durably(log, "{}\n")
    assert ("fsync", str(log)) in calls and ("fsync", str(log.parent)) in calls  # a new file's entry too
