"""The presets are listed by a command: `python -m gptcore.presets` prints every file of conf/preset/ with
the opening sentence of its comment (README's table is checked against the folder in tests/test_docs.py)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from gptcore import presets

ROOT = Path(__file__).resolve().parents[1]
PRESETS = sorted(p.stem for p in (ROOT / "conf" / "preset").glob("*.yaml"))


def test_every_preset_has_a_one_line_description():
    found = presets.preset_descriptions()
    assert sorted(found) == PRESETS and "modern_quickstart_tied" in found
    for name, about in found.items():
        assert about and about.endswith(".") and "\n" not in about and not about.startswith("@"), (name, about)
    for name, about in found.items():  # the opening comment's first sentence, its lines joined
        text = " ".join(line.lstrip("# ").strip() for line in (ROOT / "conf" / "preset" / f"{name}.yaml")
                        .read_text(encoding="utf-8").splitlines() if line.startswith("#"))
        assert about in text, (name, about)


def test_first_sentence_stops_only_at_a_full_stop_that_ends_a_sentence():
    first = presets._first_sentence
    assert first("Ratio 1.26 of (a.py. b) here. Next.") == "Ratio 1.26 of (a.py. b) here."
    assert first("No full stop") == "No full stop"
    assert first("") == ""


def test_a_preset_without_a_comment_is_listed_as_such(tmp_path):
    (tmp_path / "bare.yaml").write_text("# @package _global_\npreset: bare\n", encoding="utf-8")
    (tmp_path / "told.yaml").write_text("# @package _global_\n# Two lines of\n# text. More.\npreset: told\n",
                                        encoding="utf-8")
    assert presets.preset_descriptions(tmp_path) == {"bare": "", "told": "Two lines of text."}
    lines = presets.list_presets(tmp_path)
    assert lines[0].startswith("bare  (no description: ") and lines[1] == "told  Two lines of text."


def test_the_command_lists_every_preset_and_marks_the_default():
    out = subprocess.run([sys.executable, "-m", "gptcore.presets"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, check=True).stdout.splitlines()
    assert [line.split()[0] for line in out[:-1]] == PRESETS
    assert [re.match(r"quickstart \(default\) +The quick-start: ", line) is not None for line in out].count(True) == 1
    assert out[-1] == "run one: dvc exp run -S preset=<name>"


# karpathy/llm.c scripts/run_gpt2_350M.sh, run_gpt2_774M.sh, run_gpt2_1558M.sh, written out by hand: -e dN (depth),
# -b (micro batch on 8 GPUs), -d (tokens a step), -l, -q (floor as a share of -l), -u, -x, -c (weight decay); its
# loader permutes the training data every epoch (train_gpt2.cu: permute_train_loader unless overfitting one batch)
LLMC = {
    "gpt2_350m": dict(n_layer=24, micro_batch=64, total_batch_tokens=524288, max_lr=3e-4, min_lr_ratio=0.0,
                      warmup_steps=700, max_steps=60000),
    "gpt2_774m": dict(n_layer=36, micro_batch=32, total_batch_tokens=524288, max_lr=2.5e-4, min_lr_ratio=0.0,
                      warmup_steps=700, max_steps=286102),
    "gpt2_1558m": dict(n_layer=48, micro_batch=16, total_batch_tokens=1048576, max_lr=6e-4, min_lr_ratio=0.1,
                       warmup_steps=700, max_steps=32000),
}


def test_the_llm_c_presets_take_its_scripts_values_and_shuffle_as_it_does():
    for name, want in LLMC.items():
        sections = presets.composed(name)
        model, train = sections["model"], sections["train"]
        got = {"n_layer": model["n_layer"], **{k: train[k] for k in want if k != "n_layer"}}
        assert got == want, name
        assert train["weight_decay"] == 0.1 and train["grad_clip"] == 1.0 and train["nproc"] == 8, name
        assert train["shuffle"] is True, name  # llm.c shuffles; the 124M preset (build-nanogpt's) does not
        assert model["block_size"] == 1024 and train["schedule"] == "cosine", name
    assert presets.composed("gpt2_124m")["train"]["shuffle"] is False
