"""The params sections: conf/config.yaml shows exactly their classes' keys and defaults, bad values read as one line,
and which keys enter a run's fingerprint is the fields' own metadata."""
from __future__ import annotations

import re
from dataclasses import FrozenInstanceError, asdict, dataclass, replace
from pathlib import Path
from typing import Literal

import pytest
import yaml

from gptcore import conf
from gptcore.data.config import FetchConfig, TokenizeConfig
from gptcore.eval.config import EvalConfig
from gptcore.eval.val_loss import scored_count
from gptcore.model.config import ModelConfig
from gptcore.params import REQUIRED, ParamError, Section, param
from gptcore.report.config import CompareConfig
from gptcore.train.config import TrainConfig, check_run, fingerprint_params

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = {s.section: s for s in (FetchConfig, TokenizeConfig, ModelConfig, TrainConfig, EvalConfig, CompareConfig)}


def test_config_yaml_is_written_from_the_config_classes():
    """One source: conf/config.yaml is exactly what `python -m gptcore.conf` renders from the classes."""
    assert (ROOT / "conf" / "config.yaml").read_text(encoding="utf-8") == conf.render(), (
        "conf/config.yaml is out of date with the config classes: run `python -m gptcore.conf`")
    assert {s.section for s in conf.SECTIONS} == set(SECTIONS)


def test_config_yaml_reads_the_same_in_yaml_1_2_and_holds_every_default():
    """DVC reads conf/config.yaml with ruamel (YAML 1.2), the stages read params.yaml with PyYAML (1.1): both must
    give each class's defaults, and each default must be allowed by its own key."""
    from ruamel.yaml import YAML

    text = (ROOT / "conf" / "config.yaml").read_text(encoding="utf-8")
    for doc in (yaml.safe_load(text), YAML(typ="safe").load(text)):
        assert set(doc) - {"defaults", "preset"} == set(SECTIONS)
        for name, cls in SECTIONS.items():
            assert list(doc[name]) == list(cls.params())
            for key, rules in cls.params().items():
                shown = doc[name][key]
                if rules.default is REQUIRED:
                    assert shown == "???"
                else:
                    assert shown == rules.default and type(shown) is type(rules.default), (name, key, shown)
                    rules.check(f"{name}.{key}", rules.default)
                assert rules.doc, f"{name}.{key}: no description"


def test_the_fingerprint_holds_what_shapes_the_weights_and_only_what_applies():
    """resume_ok keys (how a run executes) stay out; Muon's keys count only for a Muon run, decay_frac only for WSD."""
    train = TrainConfig.read({"micro_batch": 4, "total_batch_tokens": 512, "max_steps": 5, "warmup_steps": 1,
                              "max_lr": 1e-3, "eval_every": 0, "val_tokens": 200, "ckpt_every": 1})
    fp = train.fingerprint()
    assert {"max_lr", "max_steps", "warmup_steps", "total_batch_tokens", "seed", "shuffle", "dtype"} <= set(fp)
    assert not ({"nproc", "micro_batch", "device", "compile", "val_tokens", "ckpt_every", "muon_lr", "decay_frac"}
                & set(fp))
    muon = replace(train, optimizer="muon", schedule="wsd")
    assert {"muon_lr", "muon_momentum", "muon_clip", "decay_frac"} <= set(muon.fingerprint())
    # a key that does not apply never tells two runs apart
    assert (replace(train, muon_lr=0.5).fingerprint() == fp
            and replace(muon, muon_lr=0.5).fingerprint() != muon.fingerprint())
    model = ModelConfig.read({"n_layer": 1, "n_head": 1, "n_embd": 8, "block_size": 8})
    assert fingerprint_params(model, train, {"name": "gpt2"}) == {"model": asdict(model), "train": fp,
                                                                  "data": {"name": "gpt2"}}


def _train(**kw):
    return {"micro_batch": 4, "total_batch_tokens": 512, "max_steps": 10, "warmup_steps": 2, "max_lr": 1e-3,
            "eval_every": 5, "val_tokens": 200, "ckpt_every": 5, **kw}


@pytest.mark.parametrize("section, values, message", [
    (TrainConfig, _train(max_steps=-1), "train.max_steps=-1: must be an integer >= 0"),
    (TrainConfig, _train(max_lr="fast"), "train.max_lr='fast': must be a number > 0"),
    (TrainConfig, _train(max_lr=True), "train.max_lr=True: must be a number > 0"),
    (TrainConfig, _train(warmup_steps=20), "train.warmup_steps=20: must be <= train.max_steps=10"),
    (TrainConfig, _train(ckpt_every=0), "train.ckpt_every=0: must be an integer >= 1"),
    (TrainConfig, _train(micro_batch=-8), "train.micro_batch=-8: must be an integer >= 1"),
    (TrainConfig, _train(total_batch_tokens=-512), "train.total_batch_tokens=-512: must be an integer >= 1"),
    (TrainConfig, _train(nproc="1 --version; echo X > f"),
     "train.nproc='1 --version; echo X > f': must be an integer >= 1"),
    (TrainConfig, _train(dtype="fp8"), "train.dtype='fp8': must be one of bfloat16, float16, float32"),
    (TrainConfig, _train(device="gpu"), "train.device='gpu': must be auto, cpu, cuda, cuda:N or mps"),
    (TrainConfig, _train(hellaswag_examples=0), "train.hellaswag_examples=0: must be an integer >= 1 or null"),
    (TrainConfig, _train(keep_checkpoints=0), "train.keep_checkpoints=0: must be an integer >= 1"),
    (TrainConfig, _train(lr=1), "train.lr=1: unknown param (known: nproc, device, micro_batch,"),
    (TrainConfig, {k: v for k, v in _train().items() if k != "max_lr"},
     "train.max_lr=None: required (no default): set it in the preset or params.yaml"),
    (EvalConfig, {"tasks": "cloze", "val_tokens": 100, "sample_prompt": ""},
     "eval.tasks='cloze': must be a list of distinct strings"),
    (EvalConfig, {"tasks": ["cloze"], "val_tokens": 0, "sample_prompt": ""},
     "eval.val_tokens=0: must be an integer >= 1"),
    (EvalConfig, {"tasks": ["cloze"], "val_tokens": 100, "sample_prompt": "", "eval_batch": 0},
     "eval.eval_batch=0: must be an integer >= 1"),
    (EvalConfig, {"tasks": ["cloze"], "val_tokens": 100, "sample_prompt": "", "samples": -1},
     "eval.samples=-1: must be an integer >= 0"),
    (EvalConfig, {"tasks": ["cloze"], "val_tokens": 100, "sample_prompt": "", "tsak": 1}, "eval.tsak=1: unknown param"),
    (ModelConfig, {"n_layer": 2, "n_head": 3, "n_embd": 32, "block_size": 16},
     "model.n_embd=32: must be divisible by model.n_head=3"),
    (ModelConfig, {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 16, "vocab_size": "big"},
     "model.vocab_size='big': must be an integer >= 1 or auto"),
    (ModelConfig, {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 16, "dropout": 1.0},
     "model.dropout=1.0: must be a number >= 0 and < 1"),
    (TokenizeConfig, {"tokenizer": "gpt2", "val_tokens": -1}, "tokenize.val_tokens=-1: must be an integer >= 0"),
])
def test_bad_values_are_one_line_naming_the_key(section, values, message):
    with pytest.raises(ParamError) as e:
        section.read(values)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_the_smoke_preset_on_two_processes_is_told_the_micro_batch_that_fits():
    """Issue 45's case: `-S preset=smoke -S train.parallel=fsdp -S train.nproc=2` doubles the tokens a micro step;
    the refusal names the micro batch that keeps the smoke run's 1,024 tokens a step."""
    from gptcore.presets import composed

    p = composed("smoke")
    model, train = ModelConfig.read(p["model"]), TrainConfig.read({**p["train"], "parallel": "fsdp", "nproc": 2})
    with pytest.raises(ParamError) as e:
        check_run(model, train, world_size=2)
    assert str(e.value) == ("train.total_batch_tokens=1024: must be a multiple of train.micro_batch * model.block_size "
                            "* processes = 16 * 64 * 2 = 2048; -S train.micro_batch=8 fits (the tokens a step, and so "
                            "the run, stay the same)")
    check_run(model, replace(train, micro_batch=8), world_size=2)  # and it does


def test_values_are_read_as_the_code_needs_them():
    t = TrainConfig.read(_train(max_lr="6e-4", eps=1))  # PyYAML reads 6e-4 (no dot) as a string
    assert t.max_lr == 6e-4 and isinstance(t.eps, float)
    assert t.eval_batch == 32 and t.shuffle is True  # defaults come from the class
    with pytest.raises(FrozenInstanceError):
        t.max_lr = 1.0


def test_checks_between_sections():
    model = ModelConfig.read({"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 64})
    train = TrainConfig.read(_train())
    check_run(model, train, world_size=2)  # 512 = 4 * 64 * 2
    with pytest.raises(ParamError, match=r"train.total_batch_tokens=512: must be a multiple of .* = 4 \* 64 \* 4 = "
                                         r"1024; -S train.micro_batch=2 fits \(the tokens a step"):
        check_run(model, train, world_size=4)
    # where no micro batch divides the step, the step sizes either side of it (the run changes: the user decides)
    with pytest.raises(ParamError, match=r"= 4 \* 64 \* 1 = 256; no micro batch divides it: -S "
                                         r"train.total_batch_tokens=256 or 512 fits$"):
        check_run(model, TrainConfig.read(_train(total_batch_tokens=300)), world_size=1)
    with pytest.raises(ParamError, match=r"train.val_tokens=63: must be >= the model's block_size = 64"):
        check_run(model, TrainConfig.read(_train(val_tokens=63)), world_size=1)
    check_run(model, train, world_size=1, val_split_tokens=150)  # val_tokens=200 is at most: the split's 150 count
    with pytest.raises(ParamError, match="train.val_tokens=200: the val split holds 60 tokens, under one window of the "
                                         "model's block_size = 64: tokenize a larger val split"):
        check_run(model, train, world_size=1, val_split_tokens=60)
    ev = EvalConfig.read({"tasks": ["cloze"], "val_tokens": 1000, "sample_prompt": ""})
    with pytest.raises(ParamError, match=r"eval.val_tokens=1000: must be >= the model's block_size = 1024"):
        scored_count("eval.val_tokens", ev.val_tokens, 1024)


def test_a_val_loss_scores_at_most_val_tokens_and_null_is_the_whole_split():
    """As lm-eval's --limit: the count asked for where the split holds it, the split where it holds fewer."""
    assert scored_count("eval.val_tokens", 100, 64, 1000) == 100
    assert scored_count("eval.val_tokens", 5000, 64, 1000) == 1000
    assert scored_count("eval.val_tokens", None, 64, 1000) == 1000
    with pytest.raises(ParamError, match=r"eval.val_tokens=None: the val split holds 50 tokens, under one window"):
        scored_count("eval.val_tokens", None, 64, 50)


def test_a_field_s_annotation_is_its_type_and_null_or_a_literal_are_allowed_by_it():
    """What a new section looks like: the type, the nulls and the literals come from the annotation alone."""

    @dataclass(frozen=True, kw_only=True)
    class Toy(Section):
        section = "toy"
        names: list[str] = param([], "a list")
        cap: float | None = param(None, "a cap", above=0.0)
        size: int | Literal["auto"] = param("auto", "a size", min=1)
        need: int = param(REQUIRED, "required")

    a, b = Toy.read({"need": 1}), Toy.read({"need": 2, "size": 3, "cap": "1e-3"})
    a.names.append("x")
    assert Toy.read({"need": 1}).names == [] and a.cap is None and a.size == "auto" and b.cap == 1e-3
    for bad, says in (({"need": 1, "size": "big"}, "toy.size='big': must be an integer >= 1 or auto"),
                      ({"need": 1, "cap": 0}, "toy.cap=0: must be a number > 0 or null"),
                      ({"need": 1, "names": ["a", "a"]}, "toy.names=['a', 'a']: must be a list of distinct strings"),
                      ({}, "toy.need=None: required (no default)")):
        with pytest.raises(ParamError, match=re.escape(says)):
            Toy.read(bad)


def test_a_param_whose_package_is_not_installed_is_refused_before_any_pass_with_the_install_line(monkeypatch):
    """The quick start's install leaves out W&B and lm-eval: asking for them is one line naming the key and the pinned
    install, from the checks train and evaluate run before their first step (not an ImportError mid-run)."""
    import importlib.util

    from gptcore.errors import MissingPackage
    from gptcore.eval.config import check_scoring

    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("wandb", "lm_eval")
                        else find(name, *a))
    params = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    with pytest.raises(MissingPackage, match=r"^train.wandb_log needs the package wandb \(not installed\): pip "
                                             r"install -r requirements-dev.txt"):
        TrainConfig.read({**params["train"], "wandb_log": True})
    evaluation = EvalConfig.read({**params["eval"], "lm_eval_tasks": ["hellaswag"]})
    with pytest.raises(MissingPackage, match=r"^eval.lm_eval_tasks needs the package lm_eval"):
        check_scoring(evaluation, 64, None)
    TrainConfig.read(params["train"])  # not asked for: nothing needed


# params.yaml (and every YAML file the project reads) as YAML defines it, through a stage as DVC runs it

MERGED = """\
mine: &mine
  source: local
  path: a.txt
  max_docs: 5
fetch:
  <<: *mine
  path: b.txt
"""


def fetch_in(project: Path, params: str | bytes) -> tuple[int, list[str]]:
    """`python -m stages.fetch` in `project` with this params.yaml: its exit status and its lines."""
    import os
    import subprocess
    import sys

    (project / "params.yaml").write_bytes(params if isinstance(params, bytes) else params.encode())
    proc = subprocess.run([sys.executable, "-m", "stages.fetch"], cwd=project, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    return proc.returncode, [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("[")]


def test_anchors_and_merge_keys_read_as_yaml_defines_them(tmp_path):
    """`<<: *anchor` was "not valid YAML ... fix the indentation"; the merged keys give way to the mapping's own."""
    (tmp_path / "a.txt").write_text("from a\n", encoding="utf-8")
    (tmp_path / "b.txt").write_text("from b\n", encoding="utf-8")
    status, lines = fetch_in(tmp_path, MERGED)
    assert status == 0 and lines[-1] == "[fetch] 1 document from local b.txt, 1 file read -> data/raw", lines


@pytest.mark.parametrize("params, says", [
    (MERGED + "  max_docs: 6\n  max_docs: 7\n", "[fetch] params.yaml:9: key 'max_docs' is given twice (also on line "
                                                "8): keep one"),
    (MERGED.replace("max_docs: 5", "max_docs: .nan"), "[fetch] params.yaml:4: .nan is not a finite number: give a "
                                                      "number (or null where the key allows none)"),
    ("fetch: {source: local, path: a.txt, max_docs: -.inf}", "[fetch] params.yaml:1: -.inf is not a finite number"),
    (MERGED.replace("<<: *mine", "<<: *yours"), "[fetch] params.yaml:6:7: not valid YAML (found undefined alias "
                                                "'yours')"),
    (b"fetch:\n  source: \xff", "[fetch] params.yaml: not UTF-8 (byte 0xff at offset 17, line 2)"),
])
def test_a_key_twice_a_non_finite_number_or_a_bad_alias_is_one_line_naming_the_line(tmp_path, params, says):
    status, lines = fetch_in(tmp_path, params)
    assert status == 1 and len(lines) == 1 and lines[0].startswith(says), lines
