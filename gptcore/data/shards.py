"""Token shards on disk, from the tokenize stage's writer to the trainer's reader: one format, so one module.

A shard is a 1-D `.npy` array (uint16 when the vocabulary fits, else uint32) named {split}_{index:06d}.npy, the val
split first; every shard holds `shard_tokens` tokens but the last of each split. manifest.json records the tokenizer,
dtype, params fingerprint and, per finished shard, its counts, sha256 and where the next shard starts in the document
stream, so an interrupted run restarts at the first unfinished shard and writes the same bytes. TokenLoader reads the
train split back as rank-disjoint, resumable, optionally shuffled batches.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import struct
import sys
from collections import deque
from concurrent.futures import Executor, Future
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from gptcore.atomic import TMP_SUFFIX, file_sha256, json_sha256, naming, publish, temp_beside, write_json
from gptcore.process import UserError

if TYPE_CHECKING:
    import torch

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


class CannotFinish(UserError):
    """These params cannot make a complete run of this corpus (val_tokens beyond its tokens, ids beyond the dtype):
    a rerun would fail again, so what they wrote is not worth keeping."""


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


def verify(shard_dir: str | Path) -> list[str]:
    """Recheck every shard against manifest.json (size, dtype, token and document counts, sha256): the problems."""
    shard_dir = Path(shard_dir)
    try:
        m = read_manifest(shard_dir)
    except (ManifestMissing, CorruptManifest) as e:
        return [str(e)]
    problems = []
    if not m.get("complete", False):
        problems.append(f"{shard_dir / MANIFEST}: the tokenize run has not finished ({len(m['shards'])} shards so far)")
    return problems + check_files(shard_dir, m, full=True)


def open_split(shard_dir: str | Path, split: str) -> list[Path]:
    """One split's shards for train and evaluate, after cheap checks of the whole folder (manifest complete, every
    listed shard at its size and dtype, none unlisted; build-nanogpt's shards, with no manifest: load_tokens')."""
    shard_dir = Path(shard_dir)
    if not (shard_dir / MANIFEST).exists():
        paths = list_shards(shard_dir, split)
        for p in paths:
            load_tokens(p)
        return paths
    m = read_manifest(shard_dir)
    if m.get("complete") is not True:
        raise UserError(f"{shard_dir / MANIFEST}: complete: false, the tokenize run has not finished "
                        f"({len(m['shards'])} shards so far); rerun the tokenize stage to finish it")
    problems = check_files(shard_dir, m, full=False)
    if problems:
        more = f" (and {len(problems) - 1} more: gptcore-verify-shards {shard_dir} lists them)" if len(problems) > 1 else ""
        raise UserError(f"{problems[0]}{more}; rerun the tokenize stage: it names what to delete, then rewrites it")
    paths = [shard_dir / s["name"] for s in m["shards"] if s["split"] == split]
    if not paths:
        raise UserError(f"{shard_dir / MANIFEST}: lists no {split} shards")
    return paths


def split_tokens(shard_dir: str | Path, split: str) -> int:
    """How many tokens the shards of `split` hold (from the headers; `open_split`'s checks first)."""
    return sum(len(load_tokens(p)) for p in open_split(shard_dir, split))


def identity(shard_dir: str | Path) -> str:
    """A digest naming exactly the shards in `shard_dir`: of the manifest's per-shard name, split, token count and
    sha256 (nothing reread); without a manifest (build-nanogpt's shards), of the files' names and sizes."""
    shard_dir = Path(shard_dir)
    if (shard_dir / MANIFEST).exists():
        m = read_manifest(shard_dir)
        return json_sha256([[s["name"], s["split"], s["tokens"], s["sha256"]] for s in m["shards"]])
    return json_sha256([[p.name, p.stat().st_size] for split in SPLITS for p in list_shards(shard_dir, split)])


def check_token_range(tokens: np.ndarray, vocab_size: int, path: str | Path, offset: int = 0) -> None:
    """UserError naming the shard and offset if an id in `tokens` (the shard's from `offset` on) is outside
    0..vocab_size-1; one vectorised max, cheap enough for every batch."""
    if tokens.size and int(tokens.max()) >= vocab_size:
        at = int(np.argmax(tokens >= vocab_size))
        raise UserError(f"{path}: token id {int(tokens[at])} at token offset {offset + at:,} is outside the "
                        f"vocabulary (vocab_size {vocab_size}); the shard is corrupt: rerun tokenize")


def main(argv: list[str] | None = None) -> int:
    """gptcore-verify-shards [shard_dir]: recheck shards against manifest.json; exit 1 on any problem."""
    ap = argparse.ArgumentParser(prog="gptcore-verify-shards", description=main.__doc__)
    ap.add_argument("shard_dir", nargs="?", default="data/shards")
    args = ap.parse_args(argv)
    problems = verify(args.shard_dir)
    if problems:
        print("\n".join(problems))
        print(f"{len(problems)} problem(s) in {args.shard_dir}", file=sys.stderr)
        return 1
    m = read_manifest(args.shard_dir)
    tokens = sum(s["tokens"] for s in m["shards"])
    print(f"ok: {len(m['shards'])} shards, {tokens:,} tokens, {m['dtype']}, tokenizer {m['tokenizer']['name']}")
    return 0


# -- writing ----------------------------------------------------------------------------------

def clear_shard_dir(shard_dir: str | Path) -> None:
    """Delete what a tokenize run writes (shards, temp files, manifest)."""
    shard_dir = Path(shard_dir)
    if not shard_dir.is_dir():
        return
    for p in shard_dir.iterdir():
        if p.is_file() and (_NAME.match(p.name) or p.name == MANIFEST
                            or (p.name.startswith(".") and p.name.endswith(TMP_SUFFIX))):
            p.unlink()


def piece_path(shard_dir: str | Path, first_doc: int) -> Path:
    """Where a tokenize worker leaves the tokens of the task starting at document `first_doc` until they are copied
    into their shard(s): a hidden temp name, removed by the writer (or by the next run, after a kill)."""
    return Path(shard_dir) / f".piece.{first_doc:012d}{TMP_SUFFIX}"


def assemble_shard(shard_dir: str, name: str, dtype: str, n_tokens: int, segments: list[tuple[str, int, int]],
                   drop: tuple[str, ...] = ()) -> tuple[str, str]:
    """Write shard `name` to a temp file from token ranges [start, stop) of piece files, hashing and fsyncing it, then
    delete the spent pieces `drop`; returns (temp path, sha256). In a worker, so the bytes never reach the parent."""
    dt = np.dtype(dtype)
    header = npy_header(dt, n_tokens)
    h = hashlib.sha256(header)
    tmp = temp_beside(Path(shard_dir) / name)
    try:
        with open(tmp, "wb") as f:
            f.write(header)
            for path, start, stop in segments:
                chunk = np.fromfile(path, dtype=dt, count=stop - start, offset=start * dt.itemsize)
                if len(chunk) != stop - start:
                    raise RuntimeError(f"{path}: {len(chunk)} tokens from {start}, expected {stop - start}")
                h.update(chunk)
                f.write(chunk.data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    for spent in drop:
        Path(spent).unlink(missing_ok=True)
    return str(tmp), h.hexdigest()


class InlineExecutor(Executor):
    """An executor that runs each call at once in this process (one worker, no pool)."""

    def submit(self, fn: Callable, /, *args: Any, **kwargs: Any) -> Future:
        """Run fn(*args, **kwargs) now; its result or exception is in the returned future, as a pool would leave it."""
        f: Future = Future()
        try:
            f.set_result(fn(*args, **kwargs))
        except Exception as e:  # noqa: BLE001  (handed to whoever asks for the result, as a pool would)
            f.set_exception(e)
        return f


class ShardWriter:
    """Cuts an ordered stream of tokenized documents into shards.

    `header` is what the manifest records besides the shards (tokenizer, dtype, fingerprint, ...); `resume`, the
    manifest of an unfinished run with the same fingerprint, whose finished shards are kept (`resume_point`: the
    document the stream restarts at, and how many of its tokens to drop). The writer only keeps the books (where each
    piece's tokens fall, counts, resume points, the manifest); assembling and rereading shards runs on `pool`."""

    def __init__(self, shard_dir: str | Path, header: dict, shard_tokens: int, val_tokens: int,
                 resume: dict | None = None, pool: Executor | None = None) -> None:
        assert shard_tokens >= 1 and val_tokens >= 0, (shard_tokens, val_tokens)  # the tokenize schema checked them
        self.dir = Path(shard_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.dtype = np.dtype(header["dtype"])
        self.shard_tokens, self.val_tokens = shard_tokens, val_tokens
        self.manifest = dict(header, format=FORMAT, shard_tokens=shard_tokens, val_tokens=val_tokens,
                             complete=False, shards=[])
        self.pos = 0  # global token position of the next token to write
        self.resume_point = (0, 0)
        if resume is not None:
            self._adopt(resume)
        for p in self.dir.glob(f".*{TMP_SUFFIX}"):  # partial files and pieces of a killed run are never shards
            p.unlink()
        self.pool: Executor = pool or InlineExecutor()  # may be replaced before the first add
        self._open = False  # whether a shard is being filled (_start_shard)
        self._expect_doc, self._drop = self.resume_point
        self._closed = 0  # shards handed to assembly; the next one to close has this number
        self._closing: deque = deque()  # (future of assemble_shard, record), in shard order
        self._pieces: deque = deque()  # (piece path, number of the last shard that reads it)
        self._written: set[str] = set()  # the shards this writer assembled and hashed itself
        self._spent: list[Path] = []  # pieces no shard needs any more, for the next assembly to delete
        if not self.manifest["complete"]:
            write_json(self.dir / MANIFEST, self.manifest, indent=1)

    def _adopt(self, old: dict) -> None:
        """Keep the finished shards of `old` on disk at their recorded size, up to the first one missing or out of the
        layout's sequence (an older gptcore could list shards after a gap): what follows is rewritten."""
        kept, listed = [], old.get("shards", [])
        for i, s in enumerate(listed):
            split, index, cap = self._current()
            path = self.dir / s["name"]
            short = s["tokens"] < cap and i < len(listed) - 1  # only the run's last shard may be short
            if s["name"] != shard_name(split, index) or s["tokens"] > cap or short or not path.is_file():
                break  # rewrite from this one on
            want = shard_bytes(self.dtype, s["tokens"])
            if path.stat().st_size != want:
                raise CorruptShard(f"{path}: {path.stat().st_size} bytes, the manifest says {want}; the finished "
                                   f"shard is damaged (delete it, then rerun tokenize to rewrite it)")
            kept.append(s)
            self.pos += s["tokens"]
        self.manifest["shards"] = kept
        self.manifest["complete"] = bool(old.get("complete")) and len(kept) == len(listed)
        if self.manifest["complete"]:
            self.manifest.update({key: old[key] for key in ("documents", "tokens") if key in old})
        if kept:
            self.resume_point = (kept[-1]["next"]["doc"], kept[-1]["next"]["offset"])

    @property
    def complete(self) -> bool:
        """True once every shard is written and the manifest says so."""
        return bool(self.manifest["complete"])

    def _current(self) -> tuple[str, int, int]:
        """(split, index, capacity) of the shard holding global position self.pos."""
        if self.pos < self.val_tokens:
            i = self.pos // self.shard_tokens
            return "val", i, min(self.shard_tokens, self.val_tokens - i * self.shard_tokens)
        i = (self.pos - self.val_tokens) // self.shard_tokens
        return "train", i, self.shard_tokens

    def _start_shard(self) -> None:
        self._split, index, self._cap = self._current()
        self._name = shard_name(self._split, index)
        self._open = True
        self._segments: list[tuple[str, int, int]] = []  # (piece path, start, stop) of the open shard
        self._in_shard = self._docs_in_shard = 0

    def add(self, first_doc: int, tokens: np.ndarray, starts: np.ndarray) -> None:
        """Append documents first_doc, first_doc+1, ...: `tokens` is their concatenation (each beginning with eot)
        and `starts` the offset of each document in it."""
        if tokens.dtype != self.dtype:
            raise TypeError(f"tokens are {tokens.dtype}, the shards are {self.dtype}")
        path = piece_path(self.dir, first_doc)
        tokens.tofile(path)  # raw bytes, not fsynced: the shard made of them is
        self.add_piece(first_doc, len(tokens), starts, path)

    def add_piece(self, first_doc: int, n_tokens: int, starts: np.ndarray, path: str | Path) -> None:
        """add() of documents whose n_tokens tokens are in the piece file `path` (the writer deletes it); then the
        shards assembled so far are published, in order."""
        if self.complete:
            raise RuntimeError(f"{self.dir}: the shards are already complete")
        if first_doc != self._expect_doc:
            raise RuntimeError(f"documents out of order: got {first_doc}, expected {self._expect_doc}")
        self._expect_doc += len(starts)
        starts = np.asarray(starts, dtype=np.int64)
        at, self._drop = self._drop, 0  # resuming inside a document: its first tokens are in the previous shard
        while at < n_tokens:
            if not self._open:
                self._start_shard()
            take = min(self._cap - self._in_shard, n_tokens - at)
            self._segments.append((str(path), at, at + take))
            self._docs_in_shard += int(np.count_nonzero((starts >= at) & (starts < at + take)))
            self._in_shard += take
            self.pos += take
            at += take
            if self._in_shard == self._cap:
                # where the next shard starts: the document holding token `at` and the offset in it
                j = int(np.searchsorted(starts, at, side="right")) - 1
                nxt = (first_doc + j, int(at - starts[j])) if at < n_tokens else (first_doc + len(starts), 0)
                self._close(nxt)
        # the last shard that reads this piece: the open one if it does, else the one just closed
        reads = self._open and self._segments and self._segments[-1][0] == str(path)
        self._pieces.append((Path(path), self._closed if reads else self._closed - 1))
        self._drain()

    def _close(self, nxt: tuple[int, int]) -> None:
        """Hand the full (or last) shard to the pool for assembly; the next one can start at once."""
        record = {"name": self._name, "split": self._split, "tokens": self._in_shard,
                  "documents": self._docs_in_shard, "sha256": None, "next": {"doc": nxt[0], "offset": nxt[1]}}
        if "encoder" in self.manifest:  # per shard too: a resumed run may finish with another encoder
            record["encoder"] = self.manifest["encoder"]
        spent, self._spent = tuple(str(p) for p in self._spent), []
        fut = self.pool.submit(assemble_shard, str(self.dir), self._name, self.dtype.str, self._in_shard,
                               self._segments, spent)
        self._closing.append((fut, record))
        self._closed += 1
        self._open = False

    def _drain(self, wait: bool = False) -> None:
        """Publish the assembled shards in order, as far as they are done (all of them with `wait`)."""
        while self._closing and (wait or self._closing[0][0].done()):
            fut, record = self._closing[0]
            tmp, sha = fut.result()
            self._closing.popleft()
            self._publish(Path(tmp), record, sha)

    def _publish(self, tmp: Path, record: dict, sha: str) -> None:
        record["sha256"] = sha
        final = self.dir / record["name"]
        if final.exists():
            # a kill between rename and manifest update left this shard unlisted: keep it if it is what we produced
            tmp.unlink()
            if file_sha256(final) != sha:
                raise UserError(f"{final}: a finished shard with different content is in the way; "
                                f"delete it (or the whole {self.dir}) and rerun tokenize")
        else:
            # assemble_shard fsynced it; the manifest's write fsyncs the folder, so both renames are durable together
            publish(tmp, final, synced=True)
            self._written.add(record["name"])
        self.manifest["shards"].append(record)
        write_json(self.dir / MANIFEST, self.manifest, indent=1)
        # the pieces whose every reader is published are spent: the next assembly deletes them, finish the last ones
        done = self._closed - len(self._closing)
        while self._pieces and self._pieces[0][1] < done:
            self._spent.append(self._pieces.popleft()[0])

    def finish(self, documents: int) -> dict:
        """Close the last shard and mark the manifest complete; `documents` is the corpus size."""
        if self._expect_doc != documents:
            self.abort()
            raise RuntimeError(f"the stream ended at document {self._expect_doc} of {documents}")
        if self.pos <= self.val_tokens:
            self.abort()
            short = self.pos < self.val_tokens
            raise CannotFinish(f"the corpus has {self.pos:,} tokens, {'fewer than' if short else 'all taken by'} "
                               f"tokenize.val_tokens={self.val_tokens:,}; "
                               f"{'' if short else 'nothing is left for train: '}lower val_tokens")
        if self._open and self._in_shard:
            self._close((documents, 0))
        self._drain(wait=True)
        for spent in self._spent:
            spent.unlink(missing_ok=True)
        self._spent = []
        self.check_finished()
        tokens = {sp: sum(s["tokens"] for s in self.manifest["shards"] if s["split"] == sp) for sp in SPLITS}
        self.manifest.update(complete=True, documents=documents, tokens=tokens)
        write_json(self.dir / MANIFEST, self.manifest, indent=1)
        return self.manifest

    def check_finished(self) -> None:
        """Reread every finished shard against the manifest before the run may report complete, so that a flipped byte
        never reaches DVC's hash and the trainer (shards this writer hashed as it wrote them get the cheap checks).
        On a problem the manifest is left (or set back to) complete: false and the error names the file."""
        problems = check_files(self.dir, self.manifest, full=True, map_fn=self.pool.map,
                               hashed_now=frozenset(self._written))
        if problems:
            if self.manifest["complete"]:
                self.manifest["complete"] = False
                write_json(self.dir / MANIFEST, self.manifest, indent=1)
            more = f" (and {len(problems) - 1} more: {'; '.join(problems[1:4])})" if len(problems) > 1 else ""
            raise UserError(f"{problems[0]}{more}; the shards are not complete: delete the damaged or foreign "
                            f"file(s) and rerun tokenize (it rewrites from the first missing shard on)")

    def abort(self) -> None:
        """Drop the shards not yet published and every piece and temp file (once the pool's workers are stopped).
        Shards are published strictly in order, so the manifest always lists a prefix of the run, and at most the
        next shard is on disk unlisted, which the rerun recognises by its bytes."""
        self._open = False
        self._closing.clear()
        self._pieces.clear()
        self._spent = []
        for p in self.dir.glob(f".*{TMP_SUFFIX}"):  # pieces, and shards assembled or being written
            p.unlink(missing_ok=True)


# -- the training loader ----------------------------------------------------------------------

@dataclass
class LoaderState:
    """Where the loader is: epoch, shard in the epoch's order, window in the shard's, micro batch in the window."""

    epoch: int = 0
    shard: int = 0  # position in this epoch's shard order
    window: int = 0  # position in this shard's window order
    micro: int = 0  # micro batch index within the window (0 at step boundaries)


class TokenLoader:
    """Training batches (x, y) of micro_batch x block_size tokens from memory-mapped shards; rank-disjoint, resumable.

    A step reads one window of `step_tokens` (train.total_batch_tokens) contiguous tokens, plus one for the targets,
    cut into micro batches of B*T: micro batch k goes to rank k % world_size at accumulation step k // world_size, so a
    step sees the same tokens however the batch is split over ranks and accumulation steps. Windows never straddle
    shards (a shard's tail short of a window is skipped); `shuffle` permutes shards and windows each epoch, seeded by
    (seed, epoch), so the whole loader state is four integers."""

    def __init__(self, paths: Sequence[Path], micro_batch: int, block_size: int, step_tokens: int, rank: int = 0,
                 world_size: int = 1, shuffle: bool = False, seed: int = 0, vocab_size: int | None = None) -> None:
        if not paths:
            raise ValueError("no training shards given to the loader")
        self.paths = [Path(p) for p in paths]
        self.B, self.T = micro_batch, block_size
        self.step_tokens = step_tokens
        self.rank, self.world_size = rank, world_size
        per_step = micro_batch * block_size * world_size
        assert step_tokens % per_step == 0, (step_tokens, per_step)  # the train schema refused it: here, a bug
        self.grad_accum = step_tokens // per_step
        self.shuffle, self.seed = shuffle, seed
        self.vocab_size = vocab_size  # ids at or above it are reported with shard and offset, not left to crash
        # windows per shard from the header alone: the mmap costs no memory until a window is read
        self._windows = [(len(load_tokens(p)) - 1) // step_tokens for p in self.paths]
        if not any(self._windows):
            raise UserError(f"no training shard holds one step of train.total_batch_tokens={step_tokens} (+1) tokens; "
                            f"largest has {max(len(load_tokens(p)) for p in self.paths)} tokens: lower "
                            f"total_batch_tokens or add data")
        self.state = LoaderState()
        self._open: tuple[int, np.ndarray] | None = None

    def _shard_order(self, epoch: int) -> list[int]:
        order = [i for i, n in enumerate(self._windows) if n > 0]
        if self.shuffle:
            order = [order[i] for i in np.random.default_rng([self.seed, epoch]).permutation(len(order))]
        return order

    def _window_order(self, epoch: int, shard_index: int) -> np.ndarray:
        n = self._windows[shard_index]
        return np.random.default_rng([self.seed, epoch, shard_index]).permutation(n) if self.shuffle else np.arange(n)

    def _tokens(self, shard_index: int) -> np.ndarray:
        if self._open is None or self._open[0] != shard_index:
            self._open = (shard_index, load_tokens(self.paths[shard_index]))
        return self._open[1]

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's next (inputs, targets), each int64 [B, T] on the CPU."""
        import torch  # here, not at the top: the tokenize stage and its workers import this module too

        s = self.state
        shard_index = self._shard_order(s.epoch)[s.shard]
        window = int(self._window_order(s.epoch, shard_index)[s.window])
        k = s.micro * self.world_size + self.rank
        start = window * self.step_tokens + k * self.B * self.T
        buf = np.asarray(self._tokens(shard_index)[start : start + self.B * self.T + 1], dtype=np.int64)
        if self.vocab_size is not None:
            check_token_range(buf, self.vocab_size, self.paths[shard_index], start)
        x = torch.from_numpy(buf[:-1]).view(self.B, self.T)
        y = torch.from_numpy(buf[1:]).view(self.B, self.T)
        self._advance()
        return x, y

    def _advance(self) -> None:
        s = self.state
        s.micro += 1
        if s.micro < self.grad_accum:
            return
        s.micro, s.window = 0, s.window + 1
        if s.window < self._windows[self._shard_order(s.epoch)[s.shard]]:
            return
        s.window, s.shard = 0, s.shard + 1
        if s.shard == len(self._shard_order(s.epoch)):
            s.shard, s.epoch = 0, s.epoch + 1

    def _shards(self) -> list[list]:
        return [[p.name, n] for p, n in zip(self.paths, self._windows)]

    def state_dict(self) -> dict:
        """The position to resume from, with the settings and the shards (names, windows) it is only valid for."""
        return {**asdict(self.state), "seed": self.seed, "shuffle": self.shuffle, "step_tokens": self.step_tokens,
                "shards": self._shards()}

    def load_state_dict(self, d: dict) -> None:
        """Resume at a position saved by state_dict, for the same tokens per step and the same shards only."""
        if d.get("step_tokens", self.step_tokens) != self.step_tokens:
            raise ValueError(f"loader state is for {d['step_tokens']} tokens per step, this run uses {self.step_tokens}")
        if "shards" in d and [list(s) for s in d["shards"]] != self._shards():
            raise ValueError(f"loader state is for other shards ({len(d['shards'])} listed) than this run reads "
                             f"({len(self.paths)} in {self.paths[0].parent}): it cannot resume there")
        self.state = LoaderState(epoch=d["epoch"], shard=d["shard"], window=d["window"], micro=d["micro"])
