"""Digests: a file's sha256 (shards, fetched files, HellaSwag's file, checkpoints), a file's sha256 taken while it is
written (`HashingWriter`: no second read), and the sha256 of params as canonical JSON, the one fingerprint of a run's
or a shard set's params."""
from __future__ import annotations

import hashlib
import json
import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

from gptcore.errors import naming


def file_sha256(path: str | Path) -> str:
    """sha256 hex digest of a file, read in 4 MiB blocks (shards are 200 MB)."""
    h = hashlib.sha256()
    with naming(path), open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def files_sha256(paths: list[Path]) -> list[str]:
    """file_sha256 of each path, in order, several files at once (hashlib lets go of the GIL on large blocks)."""
    if len(paths) < 2:
        return [file_sha256(p) for p in paths]
    with ThreadPoolExecutor(max_workers=min(len(paths), 4)) as pool:
        return list(pool.map(file_sha256, paths))


def json_sha256(obj: Any) -> str:
    """sha256 hex digest of `obj` as canonical JSON (sorted keys; non-JSON values as str): the one params
    fingerprint."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


_BLOCK = 8 << 20  # what the hashing thread takes at a time
_AHEAD = 8  # blocks it may lag behind the writer: 64 MiB of copies at most


class HashingWriter:
    """A binary file being written, hashed on the way: `sha256` and `size` of exactly the bytes written, known once
    it is closed. The hash runs in a thread beside the writer, on copies of what was written (a writer may reuse its
    buffer once `write` returns), at most 64 MiB behind, so that it overlaps the rest of the work of a save (torch's
    serialising, the fsync) instead of adding to it. `error`: the first OSError a write met (torch.save reports a full
    disk as its own RuntimeError, which hides it)."""

    def __init__(self, f: IO[bytes]) -> None:
        self._f, self._h, self.size = f, hashlib.sha256(), 0
        self._blocks: queue.Queue[bytes | None] = queue.Queue(maxsize=_AHEAD)
        self._failed: BaseException | None = None
        self._thread = threading.Thread(target=self._hash, daemon=True, name="sha256")
        self._thread.start()
        self.sha256: str | None = None
        self.error: OSError | None = None

    def _hash(self) -> None:
        try:
            while (block := self._blocks.get()) is not None:
                self._h.update(block)
        except BaseException as e:  # said by close(), in the writer's thread
            self._failed = e
            while self._blocks.get() is not None:  # let the writer go on to close()
                pass

    def write(self, data: Any) -> int:
        """Write `data` (bytes or any buffer) to the file and queue a copy of it for the hash."""
        view = memoryview(data).cast("B")
        try:
            self._f.write(view)
        except OSError as e:
            self.error = self.error or e
            raise
        for start in range(0, len(view), _BLOCK):
            self._blocks.put(bytes(view[start:start + _BLOCK]))
        self.size += len(view)
        return len(view)

    def tell(self) -> int:
        """The bytes written so far (torch.distributed.checkpoint records each item's offset)."""
        return self._f.tell()

    def fileno(self) -> int:
        """The file's descriptor (for fsync)."""
        return self._f.fileno()

    def flush(self) -> None:
        """Flush the file's buffer."""
        self._f.flush()

    def writable(self) -> bool:
        """Always: this is a file being written."""
        return True

    def close(self) -> None:
        """Close the file, then wait for the hash of its last bytes: `sha256` is then the file's."""
        if self.sha256 is not None:
            return
        try:
            self._f.close()
        finally:
            self._blocks.put(None)
            self._thread.join()
        if self._failed is not None:
            raise self._failed
        self.sha256 = self._h.hexdigest()

    def __enter__(self) -> HashingWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
