"""gptcore.eval.measured: what evaluate records its figures were measured on, from shards the real fetch and
tokenize stages write; and compare's verdict on it."""
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from stagekit import ROOT
from test_tokenize import fetch, tokenize

from gptcore.data.shard_set import ShardSet
from gptcore.eval.config import EvalConfig
from gptcore.eval.measured import measured_on, val_split
from gptcore.report.compare import summarize

FINEWEB = ROOT.parent / "shared" / "ref-data" / "fineweb_edu_sample.jsonl"
HUB_FILE = "sample/10BT/000_00000.parquet"
TOKENIZE = {"tokenizer": "gpt2", "val_tokens": 4096, "shard_tokens": 1 << 20, "workers": 1}


@pytest.fixture(scope="module")
def parquet(tmp_path_factory) -> Path:
    """The FineWeb-Edu sample as the hub's parquet file would hold it (falls back to made-up text without it)."""
    texts = ([json.loads(line)["text"] for line in FINEWEB.open(encoding="utf-8")] if FINEWEB.is_file() else
             [f"document {i}: " + "words and more words. " * 200 for i in range(150)])
    path = tmp_path_factory.mktemp("hub") / HUB_FILE
    path.parent.mkdir(parents=True)
    pq.write_table(pa.table({"text": texts}), path)
    return path


class FileHub:
    """A hub transport serving one local parquet file as HuggingFaceFW/fineweb-edu's sample-10BT."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def resolve(self, repo_id: str, revision: str) -> str:
        return "c" * 40

    def list_files(self, repo_id: str, revision: str) -> dict[str, dict]:
        sha = hashlib.sha256(self.path.read_bytes()).hexdigest()
        return {HUB_FILE: {"size": self.path.stat().st_size, "sha256": sha, "git_sha1": None}}

    def download(self, repo_id: str, filename: str, local_dir: Path, revision: str) -> Path:
        (local_dir / filename).parent.mkdir(parents=True, exist_ok=True)
        return Path(shutil.copy(self.path, local_dir / filename))


def shards_from(tmp: Path, fetch_params: dict, transport=None, **tokenize_params) -> Path:
    fetch(fetch_params, tmp / "raw", transport=transport)
    tokenize(tmp / "raw", tmp / "shards", {**TOKENIZE, **tokenize_params}, progress=False)
    return tmp / "shards"


@pytest.fixture(scope="module")
def hub_and_local(tmp_path_factory, parquet) -> tuple[Path, Path]:
    hub = shards_from(tmp_path_factory.mktemp("a"), {"source": "hub", "name": "HuggingFaceFW/fineweb-edu",
                                                      "config": "sample-10BT"}, FileHub(parquet))
    local = shards_from(tmp_path_factory.mktemp("b"), {"source": "local", "path": str(parquet)})
    return hub, local


def test_val_split_identity_from_a_hub_fetch(hub_and_local):
    hub, _ = hub_and_local
    split = val_split(ShardSet.open(hub), scored_tokens=1024)
    val = hub / "val_000000.npy"
    assert split["val_sha256"] == [hashlib.sha256(val.read_bytes()).hexdigest()]  # the file's own bytes
    assert split["val_tokens"] == len(np.load(val)) == 4096 == split["split_tokens"]
    assert (split["tokenizer"], split["source"], split["dataset"], split["config"], split["revision"]) == \
        ("gpt2", "hub", "HuggingFaceFW/fineweb-edu", "sample-10BT", "c" * 40)
    assert split["scored_tokens"] == 1024 and len(split["fingerprint"]) == 64


def test_a_local_copy_of_the_very_files_has_the_same_val_tokens(hub_and_local):
    """What makes a local copy comparable: its val shards are byte-identical to the hub fetch's."""
    hub, local = hub_and_local
    a, b = val_split(ShardSet.open(hub), 1024), val_split(ShardSet.open(local), 1024)
    assert b["source"] == "local" and a["val_sha256"] == b["val_sha256"]
    assert a["fingerprint"] != b["fingerprint"]  # the fetched files differ (fetch rewrites local ones)


def test_compare_on_real_records(hub_and_local, tmp_path):
    """Both records through compare against the baseline (its split rule set to this split's 4,096 tokens, its loss
    to the first 1,024 of them); a loss over another count of the same split is no like."""
    hub, local = hub_and_local
    base = yaml.safe_load((ROOT / "conf" / "baselines.yaml").read_text(encoding="utf-8"))
    base["gpt2_124m"]["val_loss_measured_on"].update(split_tokens=4096, scored_tokens=1024)
    run = {"eval": {"val_loss": 4.0}}
    p = EvalConfig.read({"tasks": ["cloze"], "val_tokens": 1024, "sample_prompt": "x"})
    hub_rec, local_rec = (measured_on(p, ShardSet.open(d), None, 1024) for d in (hub, local))
    assert "val_loss_vs_gpt2" in summarize(run, base, hub_rec)["delta"]
    fewer = measured_on(EvalConfig.read({"tasks": ["cloze"], "val_tokens": 512, "sample_prompt": "x"}),
                        ShardSet.open(hub), None, 512)
    assert summarize(run, base, fewer)["comparable"]["val_loss_vs_gpt2"]["reason"] == (
        "the run's val loss is over 512 tokens of the split (eval.val_tokens), the baseline's over its first 1,024")
    assert "from local files" in summarize(run, base, local_rec)["comparable"]["val_loss_vs_gpt2"]["reason"]
    base["gpt2_124m"]["val_loss_measured_on"]["val_sha256"] = hub_rec["val_split"]["val_sha256"]
    assert summarize(run, base, local_rec)["delta"]["val_loss_vs_gpt2"] == pytest.approx(4.0 - 3.2924)


def test_another_split_rule_is_no_like(tmp_path, parquet):
    shards = shards_from(tmp_path, {"source": "hub", "name": "HuggingFaceFW/fineweb-edu", "config": "sample-10BT"},
                         FileHub(parquet), val_tokens=2048)
    reason = summarize(
        {"eval": {"val_loss": 4.0}}, yaml.safe_load((ROOT / "conf" / "baselines.yaml").read_text()),
        {"val_split": val_split(ShardSet.open(shards), 1024)})["comparable"]["val_loss_vs_gpt2"]["reason"]
    assert "first 2048 tokens (tokenize.val_tokens: 2048), the baseline's the first 100,000,000" in reason
