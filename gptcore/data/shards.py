"""The shard format and its reader: one split's shards, their manifest, and the checks train and evaluate make.

A shard is a 1-D `.npy` array (uint16 when the vocabulary fits, else uint32) named {split}_{index:06d}.npy, the val
split first; every shard holds `shard_tokens` tokens but the last of each split. manifest.json records the tokenizer,
dtype, params fingerprint and, per finished shard, its counts, sha256 and where the next shard starts in the document
stream (shard_writer.py writes them; loader.py reads the train split as batches).
"""
from __future__ import annotations

import json
import re
import struct
from pathlib import Path
from typing import Callable

import numpy as np

from gptcore.digests import file_sha256, json_sha256
from gptcore.errors import UserError, naming

MANIFEST = "manifest.json"
FORMAT = 1
SPLITS = ("val", "train")
NPY_HEADER_BYTES = 128  # a 1-D .npy v1.0 header padded to 128 bytes, as np.save writes it
_NAME = re.compile(r"^(val|train)_(\d{6})\.npy$")


class ManifestMissing(UserError):
    """The folder has no manifest.json: no tokenize run wrote it."""


class CorruptManifest(UserError):
    """manifest.json is truncated, not JSON, lacks a key, has a field of the wrong type or another format version:
    the only manifest tokenize may set aside."""


class CorruptShard(UserError):
    """A shard that is no token array of its size (truncated, padded, not .npy, another dtype or shape); never raised
    for an I/O error, which keeps its OSError."""


def dtype_for_vocab(vocab_size: int) -> np.dtype:
    """uint16 when every id 0..vocab_size-1 fits in 16 bits, else uint32."""
    if vocab_size > 2**32:
        raise ValueError(f"vocab_size {vocab_size} does not fit uint32")
    return np.dtype(np.uint16 if vocab_size <= 2**16 else np.uint32)


def npy_header(dtype: np.dtype, n: int) -> bytes:
    """The .npy v1.0 header of a 1-D little-endian array of n items, 128 bytes whatever n."""
    d = "{'descr': '%s', 'fortran_order': False, 'shape': (%d,), }" % (np.dtype(dtype).newbyteorder("<").str, n)
    body = d + " " * (NPY_HEADER_BYTES - 10 - 1 - len(d)) + "\n"
    if len(body) + 10 != NPY_HEADER_BYTES:
        raise ValueError(f"shard of {n} items: header does not fit {NPY_HEADER_BYTES} bytes")
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(body)) + body.encode("latin1")


def shard_name(split: str, index: int) -> str:
    """File name of shard `index` of `split`, e.g. val_000000.npy."""
    return f"{split}_{index:06d}.npy"


def shard_bytes(dtype: str | np.dtype, tokens: int) -> int:
    """The size on disk of a shard of `tokens` tokens of `dtype`."""
    return NPY_HEADER_BYTES + tokens * np.dtype(dtype).itemsize


# -- reading ----------------------------------------------------------------------------------

SHARD_KEYS = ("tokenizer", "vocab_size", "eot", "dtype", "shard_tokens", "shards")


def read_manifest(shard_dir: str | Path, require: tuple[str, ...] = SHARD_KEYS) -> dict:
    """The one reader of shard_dir/manifest.json: a dict holding the `require`d keys (a model/ folder's has only the
    tokenizer), else ManifestMissing or CorruptManifest naming the file (an I/O error keeps its OSError)."""
    path = Path(shard_dir) / MANIFEST
    if not path.is_file():
        raise ManifestMissing(f"{path}: no manifest; run the tokenize stage")
    try:
        with naming(path):
            m = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError: a truncated or foreign file
        raise CorruptManifest(f"{path}: not valid JSON ({e})") from None
    if not isinstance(m, dict):
        raise CorruptManifest(f"{path}: expected a JSON object")
    if missing := [key for key in require if key not in m]:
        raise CorruptManifest(f"{path}: missing key {missing[0]!r}")
    problem = _manifest_problem(m)
    if problem:
        raise CorruptManifest(f"{path}: {problem}; rerun the tokenize stage (or restore the file)")
    return m


def _is_count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _manifest_problem(m: dict) -> str | None:
    """What is wrong with a present manifest field (None: nothing): a damaged manifest is refused naming the field."""
    if "shards" in m and m.get("format") != FORMAT:  # a model folder's manifest has no shards and its own fields
        return f"format {m.get('format')!r}: this gptcore reads shard format {FORMAT} (another gptcore wrote it)"
    if "dtype" in m and m["dtype"] not in ("uint16", "uint32"):
        return f"dtype {m['dtype']!r}: must be uint16 or uint32"
    for key in ("vocab_size", "eot", "shard_tokens", "val_tokens"):
        if key in m and not _is_count(m[key]):
            return f"{key} {m[key]!r}: must be an integer >= 0"
    if "tokenizer" in m and not (isinstance(m["tokenizer"], dict) and isinstance(m["tokenizer"].get("name"), str)):
        return f"tokenizer {m['tokenizer']!r}: must be an object with the tokenizer's name"
    if "complete" in m and not isinstance(m["complete"], bool):
        return f"complete {m['complete']!r}: must be true or false"
    if "shards" not in m:
        return None
    if not isinstance(m["shards"], list):
        return f"shards {m['shards']!r}: must be a list of shard entries"
    for i, s in enumerate(m["shards"]):
        where = f"shards[{i}]"
        if not isinstance(s, dict):
            return f"{where} {s!r}: must be an object with name, split, tokens, sha256"
        if missing := [key for key in ("name", "split", "tokens") if key not in s]:
            return f"{where} has no {missing[0]!r}"
        if not isinstance(s["name"], str) or "/" in s["name"] or s["name"] in ("", ".", ".."):
            return f"{where}.name {s['name']!r}: must be a file name in the shard folder"
        if s["split"] not in SPLITS:
            return f"{where}.split {s['split']!r}: must be one of {', '.join(SPLITS)}"
        for key in ("tokens", "documents"):
            if key in s and not _is_count(s[key]):
                return f"{where}.{key} {s[key]!r}: must be an integer >= 0"
        if "sha256" in s and not isinstance(s["sha256"], str):
            return f"{where}.sha256 {s['sha256']!r}: must be a hex string"
    return None


def list_shards(shard_dir: str | Path, split: str) -> list[Path]:
    """One split's shards in order: {split}_NNNNNN.npy (no manifest: also build-nanogpt's *_{split}_NNNNNN.npy)."""
    if split not in SPLITS:
        raise ValueError(f"split {split!r}: choose from {', '.join(SPLITS)}")
    shard_dir = Path(shard_dir)
    if not shard_dir.is_dir():
        raise UserError(f"{shard_dir}: shard folder not found; run the tokenize stage")
    prefix = "" if (shard_dir / MANIFEST).exists() else "(?:.*_)?"
    pat = re.compile(rf"^{prefix}{split}_(\d{{6}})\.npy$")
    found = [(int(m.group(1)), p.name, p) for p in shard_dir.iterdir() if (m := pat.match(p.name))]
    return [p for _, _, p in sorted(found)]


def load_tokens(path: str | Path) -> np.ndarray:
    """A shard as a read-only memory map (1-D uint16/uint32); CorruptShard naming the file if it is truncated,
    corrupt or not a token array, a UserError if it is missing (any other OSError is left as it is)."""
    path = Path(path)
    try:
        with naming(path), open(path, "rb") as f:
            magic = f.read(6)
    except FileNotFoundError:
        raise UserError(f"{path}: cannot read shard (no such file); rerun the tokenize stage") from None
    if magic != b"\x93NUMPY":
        raise CorruptShard(f"{path}: not a .npy file (bad magic bytes {magic!r}); the shard is corrupt")
    try:
        with naming(path):
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, EOFError) as e:  # a header numpy cannot parse, or fewer bytes than it promises
        raise CorruptShard(f"{path}: corrupt or truncated shard ({e})") from None
    if arr.ndim != 1 or arr.dtype.newbyteorder("<") not in (np.dtype("<u2"), np.dtype("<u4")):
        raise CorruptShard(f"{path}: holds a {arr.ndim}-D {arr.dtype} array, expected 1-D uint16 or uint32 tokens")
    expected = arr.offset + arr.nbytes
    actual = path.stat().st_size
    if actual != expected:
        raise CorruptShard(f"{path}: {actual} bytes on disk, the header promises {expected}; the shard is corrupt")
    return arr


def check_shard(shard_dir: str | Path, dtype: str, eot: int, s: dict, full: bool = True) -> str | None:
    """The problem of one listed shard (manifest entry `s`) as one line naming the file, or None: missing, wrong size
    or dtype, token count; `full` also rereads every byte (sha256, document count). Runs in a tokenize worker."""
    path = Path(shard_dir) / s["name"]
    if not path.is_file():
        return f"{path}: missing"
    want = shard_bytes(dtype, s["tokens"])
    if path.stat().st_size != want:
        return (f"{path}: {path.stat().st_size:,} bytes, the manifest's {s['tokens']:,} {dtype} tokens "
                f"make {want:,}; the shard is truncated or damaged")
    try:
        arr = load_tokens(path)
    except CorruptShard as e:
        return str(e)
    if arr.dtype != np.dtype(dtype):
        return f"{path}: dtype {arr.dtype}, manifest says {dtype}"
    if len(arr) != s["tokens"]:
        return f"{path}: {len(arr)} tokens, manifest says {s['tokens']}"
    if not full:
        return None
    docs = int(np.count_nonzero(arr == eot))
    if docs != s["documents"]:
        return f"{path}: {docs} documents (eot tokens), manifest says {s['documents']}"
    if file_sha256(path) != s["sha256"]:
        return f"{path}: sha256 does not match the manifest (bytes changed since tokenize wrote it)"
    return None


def check_files(shard_dir: str | Path, m: dict, full: bool = True, map_fn: Callable = map,
                hashed_now: frozenset[str] = frozenset()) -> list[str]:
    """Problems of the shard files against manifest `m`, one line each naming the file: check_shard of each listed
    shard (spread by `map_fn`; `full` rereads every byte but of the shards in `hashed_now`, hashed by this run from
    the bytes it wrote: a reread would come from the page cache), and shard files the manifest does not list."""
    shard_dir = Path(shard_dir)
    n = len(m["shards"])
    fulls = [full and s["name"] not in hashed_now for s in m["shards"]]
    found = map_fn(check_shard, [str(shard_dir)] * n, [m["dtype"]] * n, [m["eot"]] * n, m["shards"], fulls)
    problems = [p for p in found if p is not None]
    listed = {s["name"] for s in m["shards"]}
    if shard_dir.is_dir():
        problems += [f"{p}: shard file not listed in the manifest" for p in sorted(shard_dir.iterdir())
                     if _NAME.match(p.name) and p.name not in listed]
    return problems


def open_splits(shard_dir: str | Path) -> tuple[dict | None, dict[str, list[Path]]]:
    """The manifest (None for build-nanogpt's shards, which have none) and each split's shards, after cheap checks of
    the whole folder: manifest complete, every listed shard at its size and dtype, none unlisted, no split empty."""
    shard_dir = Path(shard_dir)
    if not (shard_dir / MANIFEST).exists():
        splits = {split: list_shards(shard_dir, split) for split in SPLITS}
        for p in (p for paths in splits.values() for p in paths):
            load_tokens(p)
        m = None
    else:
        m = read_manifest(shard_dir)
        if m.get("complete") is not True:
            raise UserError(f"{shard_dir / MANIFEST}: complete: false, the tokenize run has not finished "
                            f"({len(m['shards'])} shards so far); rerun the tokenize stage to finish it")
        problems = check_files(shard_dir, m, full=False)
        if problems:
            more = (f" (and {len(problems) - 1} more: gptcore-verify-shards {shard_dir} lists them)"
                    if len(problems) > 1 else "")
            raise UserError(f"{problems[0]}{more}; rerun the tokenize stage: it names what to delete, then rewrites "
                            f"it")
        splits = {split: [shard_dir / s["name"] for s in m["shards"] if s["split"] == split] for split in SPLITS}
    for split, paths in splits.items():
        if not paths:
            raise UserError(f"{shard_dir / MANIFEST if m else shard_dir}: lists no {split} shards")
    return m, splits


def identity(m: dict | None, splits: dict[str, list[Path]]) -> str:
    """A digest naming exactly these shards: of the manifest's per-shard name, split, token count and sha256 (nothing
    reread); without a manifest (build-nanogpt's shards), of the files' names and sizes."""
    if m is not None:
        return json_sha256([[s["name"], s["split"], s["tokens"], s["sha256"]] for s in m["shards"]])
    return json_sha256([[p.name, p.stat().st_size] for split in SPLITS for p in splits[split]])


def check_token_range(tokens: np.ndarray, vocab_size: int, path: str | Path, offset: int = 0) -> None:
    """UserError naming the shard and offset if an id in `tokens` (the shard's from `offset` on) is outside
    0..vocab_size-1; one vectorised max, cheap enough for every batch."""
    if tokens.size and int(tokens.max()) >= vocab_size:
        at = int(np.argmax(tokens >= vocab_size))
        raise UserError(f"{path}: token id {int(tokens[at])} at token offset {offset + at:,} is outside the "
                        f"vocabulary (vocab_size {vocab_size}); the shard is corrupt: rerun tokenize")
