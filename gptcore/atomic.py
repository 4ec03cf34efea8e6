"""Atomic file writes (write beside the target under a hidden temp name, fsync, rename) and checksums.

A reader (or a rerun after kill -9) sees the old file or the new one, never half of one. Every file gptcore writes
that a later step trusts (checkpoints, metrics, predictions, downloads, exports) goes through here.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Iterator


@contextmanager
def atomic_write(path: str | Path, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """Yield a file open on a temp name next to `path`; on a clean exit it replaces `path`, on an error it is removed.

    Raise inside the block to abandon the write (a failed checksum, say): `path` stays as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the permissions open() would
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text(path: str | Path, text: str) -> None:
    """Replace `path` with `text` (UTF-8) atomically."""
    with atomic_write(path) as f:
        f.write(text)


def write_json(path: str | Path, data: Any, indent: int = 2) -> None:
    """Replace `path` with `data` as indented JSON (UTF-8, trailing newline) atomically."""
    with atomic_write(path) as f:
        json.dump(data, f, indent=indent, ensure_ascii=False)
        f.write("\n")


def file_sha256(path: str | Path) -> str:
    """sha256 hex digest of a file, read in 4 MiB blocks (shards are 200 MB)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def json_sha256(obj: Any) -> str:
    """sha256 hex digest of `obj` as canonical JSON (sorted keys; non-JSON values as str): the one params fingerprint."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()
