"""Digests: a file's sha256 (shards, fetched files, HellaSwag's file), and the sha256 of params as canonical JSON, the
one fingerprint of a run's or a shard set's params."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from gptcore.errors import naming


def file_sha256(path: str | Path) -> str:
    """sha256 hex digest of a file, read in 4 MiB blocks (shards are 200 MB)."""
    h = hashlib.sha256()
    with naming(path), open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def json_sha256(obj: Any) -> str:
    """sha256 hex digest of `obj` as canonical JSON (sorted keys; non-JSON values as str): the one params
    fingerprint."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()
