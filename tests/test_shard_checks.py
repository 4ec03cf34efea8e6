"""Corruption is caught where it enters: tokenize rereads its shards before it reports complete; train and evaluate
refuse an unfinished, damaged or foreign-padded shard folder; an id outside the vocabulary names shard and offset."""
from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
from stagekit import env, make_project, stage_cmd, write_gpt2_shards
from test_tokenize import make_raw, synthetic_docs, tokenize

from gptcore.data import shards as S
from gptcore.data import verify
from gptcore.data.loader import TokenLoader
from gptcore.errors import UserError
from gptcore.eval.val_loss import first_tokens

PARAMS = {"tokenizer": "gpt2", "shard_tokens": 3000, "val_tokens": 3000, "workers": 1}


def flip_one_token(path, index=-1):
    """Change one token id to another valid id: same size, same dtype, different bytes."""
    data = bytearray(path.read_bytes())
    data[index * 2] ^= 1
    path.write_bytes(bytes(data))


@pytest.fixture
def tokenized(tmp_path):
    raw = make_raw(tmp_path, synthetic_docs(300, seed=3))
    m = tokenize(raw, tmp_path / "shards", PARAMS, progress=False)
    assert m["complete"] and len(m["shards"]) >= 3
    return raw, tmp_path / "shards"


def test_tokenize_rereads_finished_shards_and_refuses_flipped_bytes(tokenized):
    raw, shards = tokenized
    flip_one_token(shards / "train_000000.npy")
    with pytest.raises(UserError, match=r"train_000000\.npy: sha256 does not match the manifest.*not complete"):
        tokenize(raw, shards, PARAMS, progress=False)
    assert S.read_manifest(shards)["complete"] is False  # so train and evaluate refuse it too
    with pytest.raises(UserError, match="complete: false"):
        S.open_splits(shards)
    # the advice works: delete the named shard, rerun, and the same bytes come back
    (shards / "train_000000.npy").unlink()
    m = tokenize(raw, shards, PARAMS, progress=False)
    assert m["complete"] and verify.verify(shards) == []


def test_tokenize_refuses_to_report_complete_over_a_foreign_shard(tokenized):
    raw, shards = tokenized
    np.save(shards / "train_000077.npy", np.zeros(10, np.uint16))
    with pytest.raises(UserError, match=r"train_000077\.npy: shard file not listed in the manifest"):
        tokenize(raw, shards, PARAMS, progress=False)
    assert S.read_manifest(shards)["complete"] is False


def test_opening_the_shards_refuses_each_damage_naming_the_file(tokenized):
    _, shards = tokenized
    assert [p.name for p in S.open_splits(shards)[1]["val"]] == ["val_000000.npy"]
    manifest = json.loads((shards / "manifest.json").read_text())

    truncated = shards / "train_000001.npy"
    good = truncated.read_bytes()
    truncated.write_bytes(good[:-6])
    with pytest.raises(UserError, match=r"train_000001\.npy: .* bytes, the manifest's .* truncated"):
        S.open_splits(shards)  # the whole folder is checked
    truncated.write_bytes(good)

    np.save(shards / "train_000099.npy", np.zeros(4000, np.uint16))
    with pytest.raises(UserError, match=r"train_000099\.npy: shard file not listed in the manifest"):
        S.open_splits(shards)
    (shards / "train_000099.npy").unlink()

    (shards / "manifest.json").write_text(json.dumps(dict(manifest, complete=False)))
    with pytest.raises(UserError, match=r"manifest\.json: complete: false, the tokenize run has not finished"):
        S.open_splits(shards)
    (shards / "manifest.json").write_text(json.dumps(dict(manifest, dtype="uint32")))
    with pytest.raises(UserError, match=r"val_000000\.npy: .* bytes, the manifest's .* uint32 tokens"):
        S.open_splits(shards)
    (shards / "manifest.json").write_text(json.dumps(manifest))
    assert len(S.open_splits(shards)[1]["train"]) == len(manifest["shards"]) - 1


def test_an_id_outside_the_vocabulary_names_shard_and_offset(tmp_path):
    tokens = np.arange(2000, dtype=np.uint16) % 100
    tokens[1234] = 150
    np.save(tmp_path / "train_000000.npy", tokens)
    path = tmp_path / "train_000000.npy"
    loader = TokenLoader([path], micro_batch=2, block_size=16, step_tokens=64, vocab_size=100)
    with pytest.raises(UserError, match=r"train_000000\.npy: token id 150 at token offset 1,234 is outside the "
                                         r"vocabulary \(vocab_size 100\)"):
        for _ in range(40):
            loader.next_batch()
    with pytest.raises(UserError, match=r"train_000000\.npy: token id 150 at token offset 1,234"):
        first_tokens([path], 1500, vocab_size=100)
    assert len(first_tokens([path], 1200, vocab_size=100)) == 1200


def stage(project, name):
    return subprocess.run(stage_cmd(name), cwd=project, env=env(), capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_train_and_evaluate_refuse_an_unfinished_or_padded_folder(tmp_path):
    (tmp_path / "shards").mkdir()
    shards = write_gpt2_shards(tmp_path / "shards")
    project = make_project(tmp_path / "p", shards, max_steps=2)
    manifest = json.loads((shards / "manifest.json").read_text())
    (shards / "manifest.json").write_text(json.dumps(dict(manifest, complete=False)))
    out = stage(project, "train")
    assert out.returncode != 0 and "manifest.json: complete: false" in out.stderr
    assert not list(project.glob("checkpoints/*.pt"))
    (shards / "manifest.json").write_text(json.dumps(manifest))
    assert stage(project, "train").returncode == 0  # the intact folder trains
    np.save(shards / "val_000001.npy", np.zeros(100, np.uint16))  # a foreign val shard: it used to be read
    for name in ("evaluate", "train"):
        out = stage(project, name)
        assert out.returncode != 0 and "val_000001.npy: shard file not listed in the manifest" in out.stderr, name
