"""The tokenize stage's shard writer: an ordered stream of tokenized documents cut into shards, assembled and hashed
in worker processes, published strictly in order, resumable at the first unfinished shard with the same bytes."""
from __future__ import annotations

import hashlib
import os
from collections import deque
from concurrent.futures import Executor, Future
from pathlib import Path
from typing import Any, Callable

import numpy as np

from gptcore.atomic import TMP_SUFFIX, publish, temp_beside, write_json
from gptcore.data.shards import (
    _NAME,
    FORMAT,
    MANIFEST,
    SPLITS,
    CorruptShard,
    check_files,
    npy_header,
    shard_bytes,
    shard_name,
)
from gptcore.digests import file_sha256
from gptcore.errors import UserError


class CannotFinish(UserError):
    """These params cannot make a complete run of this corpus (val_tokens beyond its tokens, ids beyond the dtype):
    a rerun would fail again, so what they wrote is not worth keeping."""


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
        assert shard_tokens >= 1 and val_tokens >= 0, (shard_tokens, val_tokens)  # TokenizeConfig checked them
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
