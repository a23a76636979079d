"""Input files (`files`) and fetched output files (`fetch_files`): names, limits, I/O.

What a request may cost is bounded before any work is done: the server checks names,
counts and decoded sizes when it parses the request (`check_input_files`,
`unique_fetch_names`), and the worker enforces the same bounds again when it writes and
reads (a second fence, not the first). Every spelling of one path (`big`, `./big`,
`0/../big`) is the same file: names are normalised first, duplicates among the inputs are
refused and duplicates among the fetches collapse to the first spelling, so no file is read
or encoded twice. Fetches stop at `MAX_FETCH_TOTAL_BYTES` in all.
"""

from __future__ import annotations

import base64
import binascii
import os
import posixpath
import stat
from collections.abc import Mapping

MAX_FILES = 64
MAX_FETCH_FILES = 64
MAX_FETCH_FILE_BYTES = 1 << 20
MAX_FETCH_TOTAL_BYTES = 4 << 20
MAX_NAME_BYTES = 1024
MAX_COMPONENT_BYTES = 255
MAX_DEPTH = 8


class FileRequestError(ValueError):
    """A `files`/`fetch_files` entry the sandbox will not accept (the server answers 422)."""


def normalise_name(name: object) -> str:
    """The canonical relative path for `name`, or FileRequestError saying why it is refused."""
    if not isinstance(name, str) or not name:
        raise FileRequestError("file names must be non-empty strings")
    try:
        raw = name.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise FileRequestError(f"file name {name!r} is not valid UTF-8") from exc
    if b"\0" in raw or len(raw) > MAX_NAME_BYTES:
        raise FileRequestError(f"file name {name!r} holds a NUL byte or is longer than {MAX_NAME_BYTES} bytes")
    path = posixpath.normpath(name)
    parts = path.split("/")
    if name.startswith("/") or path in (".", "..") or parts[0] == ".." or len(parts) > MAX_DEPTH:
        raise FileRequestError(f"file name {name!r} must be a relative path inside the working directory, "
                               f"at most {MAX_DEPTH} levels deep")
    if any(len(part.encode()) > MAX_COMPONENT_BYTES for part in parts):
        raise FileRequestError(f"file name {name!r} has a component longer than {MAX_COMPONENT_BYTES} bytes")
    return path


def decoded_size(content: str | None) -> int:
    try:
        return len(base64.b64decode(content or "", validate=True))
    except (binascii.Error, ValueError) as exc:
        raise FileRequestError(f"file content is not valid base64: {exc}") from exc


def check_input_files(files: Mapping[str, str | None], max_total_bytes: int) -> dict[str, str]:
    """Validated inputs keyed by normalised name; refuses duplicates, too many, or too many bytes."""
    if len(files) > MAX_FILES:
        raise FileRequestError(f"{len(files)} input files; the limit is {MAX_FILES}")
    checked: dict[str, str] = {}
    total = 0
    for name, content in files.items():
        path = normalise_name(name)
        if path in checked:
            raise FileRequestError(f"input file {name!r} names the same path as another entry ({path!r})")
        total += decoded_size(content)
        checked[path] = content or ""
    if total > max_total_bytes:
        raise FileRequestError(f"input files hold {total} bytes; the limit is {max_total_bytes}")
    return checked


def unique_fetch_names(names: list[str]) -> tuple[str, ...]:
    """One spelling per normalised path (the first), invalid names dropped; refuses too many."""
    if len(names) > MAX_FETCH_FILES:
        raise FileRequestError(f"{len(names)} fetch_files entries; the limit is {MAX_FETCH_FILES}")
    seen: set[str] = set()
    unique = []
    for name in names:
        try:
            path = normalise_name(name)
        except FileRequestError:
            continue  # nothing can be fetched under a name outside the working directory
        if path not in seen:
            seen.add(path)
            unique.append(name)
    return tuple(unique)


def write_input_files(root: str, files: dict[str, str], uid: int | None) -> None:
    """Write the (already checked) inputs into the fresh working directory, owned by the snippet's uid."""
    for path, content in check_input_files(files, max_total_bytes=1 << 62).items():
        full = os.path.join(root, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        try:
            os.write(fd, base64.b64decode(content))
            if uid is not None:
                os.fchown(fd, uid, uid)
        finally:
            os.close(fd)


def read_output_files(root: str, names: tuple[str, ...]) -> dict[str, str]:
    """Fetch files the snippet wrote: no symlinks followed, regular files only, bounded bytes."""
    fetched: dict[str, str] = {}
    budget = MAX_FETCH_TOTAL_BYTES
    for name in unique_fetch_names(list(names)):
        full = os.path.join(root, normalise_name(name))
        if os.path.realpath(full) != full:
            continue
        try:
            fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            info = os.fstat(fd)
            if stat.S_ISREG(info.st_mode) and info.st_size <= min(MAX_FETCH_FILE_BYTES, budget):
                data = os.read(fd, info.st_size)
                budget -= len(data)
                fetched[name] = base64.b64encode(data).decode()
        finally:
            os.close(fd)
    return fetched
