"""The tokenize stage: fetched documents -> token shards, on every core, resumable, byte-identical whatever the
number of workers (how the work is split: docs/reproducing-gpt2.md)."""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import shutil
import signal
import time
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import numpy as np
from tqdm import tqdm

from gptcore.atomic import swap_dir
from gptcore.data import shard_writer, shards
from gptcore.data.config import TokenizeConfig
from gptcore.data.corpus import TASK_BYTES, Corpus, ReadTask, open_corpus, read_task_chunks
from gptcore.data.tokenizers import clear_tokenizer_files, has_tokenizer_file, kind_for, prepare_tokenizer
from gptcore.data.tokenizers.base import Tokenizer
from gptcore.digests import json_sha256
from gptcore.errors import UserError
from gptcore.folders import next_path, refuse_link, staged_dir
from gptcore.lifetime import die_with_parent

# a worker converts, encodes and writes its task in runs of this much text: its memory is one run's, not the task's
CHUNK_BYTES = 8 << 20


def cpu_count() -> int:
    """Cores this process may run on (respects taskset / cgroup affinity)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


# -- the worker side --------------------------------------------------------------------------

_TOK: Tokenizer | None = None
_DTYPE: np.dtype = np.dtype(np.uint16)


def _init_worker(tok: Tokenizer, dtype: str) -> None:
    global _TOK, _DTYPE
    die_with_parent()  # a killed tokenize (kill -9 included) takes its workers with it
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: one line, not one per worker
    # the inherited SIGTERM handler would leave a worker the pool stops stuck in its exit handlers
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per worker process; the pool is the parallelism
    _TOK, _DTYPE = tok, np.dtype(dtype)


def encode_documents(tok: Tokenizer, docs: list[str] | list[bytes], dtype: np.dtype,
                     first_doc: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate [eot] + tokens of every document as `dtype`; return (tokens, start offset of each document).
    Documents are str, or UTF-8 bytes for a tokenizer that `takes_utf8`; CannotFinish if an id does not fit dtype."""
    parts: list[np.ndarray] = []
    eot = np.array([tok.eot], dtype=np.uint32)
    lengths = np.empty(len(docs), dtype=np.int64)
    for i, d in enumerate(docs):
        ids = tok.encode_numpy(d)
        parts += [eot, ids]
        lengths[i] = len(ids) + 1
    flat = np.concatenate(parts) if parts else np.empty(0, dtype=np.uint32)
    limit = np.iinfo(dtype).max
    if flat.size and (int(flat.max()) > limit or (flat.dtype.kind == "i" and int(flat.min()) < 0)):
        bad = int(np.argmax((flat > limit) | (flat < 0)))
        doc = first_doc + int(np.searchsorted(np.cumsum(lengths), bad, side="right"))
        raise shard_writer.CannotFinish(
            f"tokenizer {tok.name}: token id {int(flat[bad])} in document {doc} does not fit "
            f"{dtype} (vocab_size {tok.vocab_size}); the tokenizer's vocab_size is wrong")
    starts = np.zeros(len(docs), dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    return flat.astype(dtype, copy=False), starts


def _encode_task(task: ReadTask, piece_dir: str, tok: Tokenizer | None = None,
                 dtype: np.dtype | None = None) -> tuple[int, int, np.ndarray, str]:
    """Read, encode and leave one task's tokens in a piece file (in a worker: the tokenizer of _init_worker);
    returns (first document, tokens, document starts, piece path): only counts cross the pipe, never tokens."""
    tok = tok or _TOK
    dtype = _DTYPE if dtype is None else dtype
    path = shard_writer.piece_path(piece_dir, task.first_doc)
    starts, n = [], 0
    with open(path, "wb") as f:
        for first, docs in read_task_chunks(task, CHUNK_BYTES, utf8=tok.takes_utf8):
            tokens, at = encode_documents(tok, docs, dtype, first)
            starts.append(at + n)
            n += len(tokens)
            tokens.tofile(f)  # raw bytes, not fsynced: the shard made of them is
    return task.first_doc, n, np.concatenate(starts) if starts else np.empty(0, np.int64), str(path)


def _count_task(task: ReadTask, tok: Tokenizer | None = None) -> int:
    """The tokens of one task's documents, each with its end-of-text (in a worker: the tokenizer of _init_worker)."""
    tok = tok or _TOK
    return sum(len(tok.encode_numpy(d)) + 1 for _, docs in read_task_chunks(task, CHUNK_BYTES, utf8=tok.takes_utf8)
               for d in docs)


def _start_pool(workers: int, tok: Tokenizer, dtype: np.dtype) -> ProcessPoolExecutor:
    """`workers` forked processes sharing the built tokenizer (spawned where fork does not exist). A process pool
    executor reports a worker killed by the OS as BrokenProcessPool, where multiprocessing.Pool would wait forever."""
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    saved = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # HF tokenizers checks it at the fork: no Rust pool, no warning
    # the collector's passes would touch every pre-fork object, copying the shared pages in each process
    gc.freeze()  # the caller unfreezes
    try:
        pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker, initargs=(tok, dtype.str))
        pool.submit(int).result()  # the workers exist now, forked while the variable is set
    finally:
        if saved is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = saved
    return pool


def _stop_pool(pool: ProcessPoolExecutor) -> None:
    """Cancel what has not started and kill the workers at once (a task in progress is worth nothing), waiting until
    they are gone so that none writes a piece after the clean-up."""
    procs = list((getattr(pool, "_processes", None) or {}).values())  # taken first: shutdown forgets them
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in procs:
        if proc.is_alive():
            proc.kill()
    for proc in procs:
        proc.join(5)


def task_size(text_bytes: int, workers: int, task_bytes: int = TASK_BYTES) -> int:
    """The bytes of text per task: `task_bytes`, cut for a small corpus so every worker gets about four tasks
    (never under 64 KiB); one process takes the corpus in `task_bytes` runs."""
    if workers <= 1:
        return task_bytes
    return min(task_bytes, max(64 << 10, text_bytes // (4 * workers)))


def write_shards(corpus: Corpus, shard_dir: str | Path, tok: Tokenizer, *, shard_tokens: int, val_tokens: int,
                 workers: int = 0, header: dict | None = None, resume: dict | None = None,
                 progress: bool = True, task_bytes: int = TASK_BYTES) -> dict:
    """Tokenize every document of `corpus` into shards under shard_dir; returns the manifest. `header` adds to the
    manifest (e.g. the params fingerprint); `resume` is the manifest of an unfinished run with the same fingerprint."""
    workers = workers or cpu_count()
    dtype = shards.dtype_for_vocab(tok.vocab_size)
    head = {"tokenizer": tok.record(), "vocab_size": tok.vocab_size, "eot": tok.eot, "dtype": dtype.name,
            **(header or {})}
    writer = shard_writer.ShardWriter(shard_dir, head, shard_tokens, val_tokens, resume=resume)
    if writer.complete:  # nothing to write, but the finished shards must still be the bytes the manifest lists
        try:
            writer.check_finished()
        finally:
            writer.abort()
        return writer.manifest
    pool = None
    try:
        if workers > 1:  # shards are assembled and checked by the workers too
            pool = writer.pool = _start_pool(workers, tok, dtype)
        size = task_size(corpus.text_bytes(), workers, task_bytes)
        _encode_all(corpus, writer, tok, dtype, pool, 4 * workers, size, progress)
        manifest = writer.finish(corpus.documents)
    except BaseException as e:
        if pool is not None:
            _stop_pool(pool)
        writer.abort()  # publishes nothing: the manifest stays a prefix of the run, which the rerun resumes
        if isinstance(e, BrokenProcessPool):
            raise UserError(f"a tokenize worker process died (killed by the OS, e.g. out of memory?) after "
                            f"{len(writer.manifest['shards'])} finished shards in {shard_dir}; rerun to resume "
                            f"(with fewer tokenize.workers if memory is short)") from e
        raise
    else:
        if pool is not None:
            pool.shutdown(wait=True)
    finally:
        gc.unfreeze()
    return manifest


def _encode_all(corpus: Corpus, writer: shard_writer.ShardWriter, tok: Tokenizer, dtype: np.dtype,
                pool: ProcessPoolExecutor | None, window: int, task_bytes: int, progress: bool) -> None:
    """Encode every task from the writer's resume point and hand the results to the writer in task order, through a
    `window` of tasks in flight: the shards come out in document order while memory and pieces on disk stay bounded."""
    start_doc = writer.resume_point[0]  # the writer drops the already-written head of that document
    bar = tqdm(total=corpus.documents, initial=start_doc, unit="doc", unit_scale=True, disable=not progress,
               desc="tokenize", smoothing=0.05, dynamic_ncols=True)
    t0, pos0, piece_dir = time.perf_counter(), writer.pos, str(writer.dir)
    pending: deque = deque()
    try:
        for task in corpus.tasks(start_doc=start_doc, task_bytes=task_bytes):
            if pool is None:
                _take(_encode_task(task, piece_dir, tok, dtype), writer, bar, t0, pos0)
                continue
            pending.append(pool.submit(_encode_task, task, piece_dir))
            if len(pending) >= window:
                _take(pending.popleft().result(), writer, bar, t0, pos0)
        while pending:
            _take(pending.popleft().result(), writer, bar, t0, pos0)
    finally:
        bar.close()


def _take(result: tuple[int, int, np.ndarray, str], writer: shard_writer.ShardWriter, bar: tqdm, t0: float,
          pos0: int) -> None:
    writer.add_piece(*result)
    bar.update(len(result[2]))
    rate = (writer.pos - pos0) / max(time.perf_counter() - t0, 1e-9)
    bar.set_postfix_str(f"{writer.pos / 1e6:,.1f}M tok, {rate / 1e6:.2f}M tok/s", refresh=False)


# -- the stage: params -> tokenizer -> shards -------------------------------------------------

def shards_fingerprint(p: TokenizeConfig, corpus: Corpus) -> str:
    """digests.json_sha256 over everything that determines the shards' bytes (not the worker count)."""
    inputs = [{k: f.get(k) for k in ("path", "documents", "bytes", "sha256")} for f in corpus.record["files"]]
    blob = {"format": shards.FORMAT, **kind_for(str(p.tokenizer)).identity(p), "shard_tokens": p.shard_tokens,
            "val_tokens": p.val_tokens, "text_column": corpus.text_column, "inputs": inputs}
    if p.val_tokens is None:  # the split is a share of the corpus: the share shapes the bytes
        blob["val_fraction"] = p.val_fraction
    return json_sha256(blob)


def _manifest_or_none(shard_dir: Path) -> dict | None:
    """The folder's manifest; None where there is none or it is corrupt (its run is then cleared and rewritten). An
    I/O error propagates: the folder is left as it is for the rerun."""
    try:
        return shards.read_manifest(shard_dir)
    except (shards.ManifestMissing, shards.CorruptManifest):
        return None


def check_val_fits(corpus: Corpus, p: TokenizeConfig) -> None:
    """Refuse a tokenize.val_tokens the corpus cannot hold, before any pass over it: a byte-bounded tokenizer makes at
    most one id per UTF-8 byte plus one end-of-text a document, and reading stops once that bound passes val_tokens.
    (A val_tokens between the exact count and this bound still fails, after the full pass.)"""
    if p.val_tokens is None or not kind_for(str(p.tokenizer)).bounded_by_bytes:
        return  # a share of the corpus always fits; any tokenizer.json: no bound known
    bound = 0
    for _, docs in corpus.batches():
        bound += sum(len(d.encode("utf-8")) + 1 for d in docs)
        if bound > p.val_tokens:
            return
    raise shard_writer.CannotFinish(
        f"the corpus has at most {bound:,} tokens ({corpus.documents:,} documents: their UTF-8 "
        f"bytes plus one end-of-text each), fewer than tokenize.val_tokens={p.val_tokens:,}; "
        f"lower val_tokens")


def tokenize(raw_dir: str | Path, shard_dir: str | Path, p: TokenizeConfig, progress: bool = True) -> dict:
    """The tokenize stage: documents of raw_dir/fetch.json -> shard_dir by `p` (TokenizeConfig); the manifest.
    A finished run with the same params fingerprint is left as it is, an unfinished one resumed. A finished run of
    other params stays in place while the new one is written beside it (staged_dir, resumed there) and is replaced
    only once the new run is complete; an unfinished run of other params is cleared first. The caller holds
    shard_dir's lock (the stage boundary: one tokenize per folder); its lock file moves aside with the old folder."""
    corpus = open_corpus(raw_dir)
    check_val_fits(corpus, p)
    shard_dir = Path(shard_dir)
    fp = shards_fingerprint(p, corpus)
    old = _manifest_or_none(shard_dir)
    done = old is not None and old.get("fingerprint") == fp and old.get("complete") and has_tokenizer_file(p, shard_dir)
    if done:  # a finished run of these params: read, never written (so it may be a link to shared shards)
        leftover = next_path(shard_dir)  # another run's, half written or swapped out by a kill
        if leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover)
        return _write_run(p, corpus, shard_dir, fp, old, progress)
    refuse_link(shard_dir, "tokenize", "the shards it points to may be shared")  # this run writes shards
    staged = staged_dir(shard_dir)
    next_run = _manifest_or_none(staged)
    if (old is None or old.get("fingerprint") != fp) and (
            (old is not None and old.get("complete")) or (next_run is not None and next_run.get("fingerprint") == fp)):
        try:
            manifest = _write_run(p, corpus, staged, fp, next_run, progress)
        except shard_writer.CannotFinish:  # e.g. val_tokens > the corpus: a rerun would fail again, keep no half run
            shutil.rmtree(staged)
            raise
        swap_dir(staged, shard_dir)
        return manifest
    if staged.exists():  # an unfinished run of other params
        shutil.rmtree(staged)
    return _write_run(p, corpus, shard_dir, fp, old, progress)


def _write_run(p: TokenizeConfig, corpus: Corpus, shard_dir: Path, fp: str, old: dict | None, progress: bool) -> dict:
    """Tokenize into shard_dir: nothing to do if `old` (its manifest) is complete with fingerprint `fp`, resume it
    if unfinished, else clear what a tokenize run wrote there and start over."""
    reuse = old is not None and old.get("fingerprint") == fp and has_tokenizer_file(p, shard_dir)
    if not reuse:
        shard_writer.clear_shard_dir(shard_dir)
        clear_tokenizer_files(shard_dir)
        old = None
    tok = prepare_tokenizer(p, shard_dir, corpus.texts, reuse)
    val_tokens = p.val_tokens
    if val_tokens is None:  # a resumed run keeps the split its manifest records
        val_tokens = old["val_tokens"] if old is not None else val_share(corpus, tok, p, progress)
    # the encoder (which program made the ids) is recorded, but is not in the fingerprint: the ids are the same
    header = {"fingerprint": fp, "encoder": tok.encoder,
              "params": {k: getattr(p, k) for k in ("tokenizer", "bpe_vocab_size", "eot_token", "tiktoken_pattern",
                                                    "shard_tokens", "val_tokens", "val_fraction")},
              "source": {k: corpus.record.get(k) for k in ("source", "name", "config", "revision", "documents")}}
    return write_shards(corpus, shard_dir, tok, shard_tokens=p.shard_tokens, val_tokens=val_tokens,
                        workers=p.workers, header=header, resume=old, progress=progress)


def val_share(corpus: Corpus, tok: Tokenizer, p: TokenizeConfig, progress: bool = True) -> int:
    """tokenize.val_fraction of the corpus's tokens (each document's, plus its end-of-text), counted in a pass of its
    own over every document; CannotFinish when that leaves the val split or the train split empty."""
    workers = p.workers or cpu_count()
    pool = _start_pool(workers, tok, shards.dtype_for_vocab(tok.vocab_size)) if workers > 1 else None
    total = 0
    try:
        size = task_size(corpus.text_bytes(), workers)
        tasks = corpus.tasks(task_bytes=size)
        counts = pool.map(_count_task, tasks) if pool is not None else (_count_task(t, tok) for t in tasks)
        for n in tqdm(counts, desc="count tokens", unit="task", disable=not progress, leave=False):
            total += n
    finally:
        if pool is not None:
            _stop_pool(pool)
        gc.unfreeze()
    share = round(p.val_fraction * total)
    if not 0 < share < total:
        raise shard_writer.CannotFinish(
            f"the corpus has {total:,} tokens: tokenize.val_fraction={p.val_fraction} of them leaves "
            f"{'no val split' if share <= 0 else 'nothing to train on'}; add text, or set tokenize.val_tokens")
    return share
