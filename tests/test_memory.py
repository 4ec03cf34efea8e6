"""The memory check refuses what cannot fit, never the real presets (the stage-level case is in test_bad_params)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from gptcore.errors import UserError
from gptcore.model.params import MODEL
from gptcore.train import memory
from gptcore.train.params import TRAIN

ROOT = Path(__file__).resolve().parents[1]
GIB = 1 << 30


def preset(name: str) -> tuple[dict, dict]:
    """A preset's model: and train: sections over conf/config.yaml's defaults, validated by the schemas."""
    conf = yaml.safe_load((ROOT / "conf" / "config.yaml").read_text(encoding="utf-8"))
    p = yaml.safe_load((ROOT / "conf" / "preset" / f"{name}.yaml").read_text(encoding="utf-8"))
    for base in p.get("defaults", []):  # a preset built on another one
        if isinstance(base, str) and base != "_self_":
            m, t = preset(base)
            conf["model"].update(m)
            conf["train"].update(t)
    conf["model"].update(p.get("model", {}))
    conf["train"].update(p.get("train", {}))
    return MODEL.validate(conf["model"]), TRAIN.validate(conf["train"])


def test_gpt2_124m_bound_by_hand_fits_a_40_gib_gpu():
    model, train = preset("gpt2_124m")
    # 12 blocks of 12 * 768^2 weights and the tied 50,304 x 768 table, 16 bytes each with AdamW; 64 x 1024 tokens
    # keep 7 x 768 bf16 values per block
    by_hand = 16 * (12 * 12 * 768**2 + 50304 * 768) + 64 * 1024 * 12 * 7 * 768 * 2
    assert memory.train_bytes(model, train, 50304) == by_hand
    assert by_hand < 40 * GIB  # an A100 40 GB; the H200 of the reference runs has 139 GiB


def test_quick_start_fits_this_machine_and_a_million_layers_do_not():
    model, train = preset("quickstart")
    assert memory.train_bytes(model, train, 50304) < 1 * GIB
    memory.check_fits(model, train, 50304, torch.device("cpu"))  # refuses nothing here
    huge = {**model, "n_layer": 1_000_000}
    with pytest.raises(UserError, match=r"model.n_layer=1000000, .* training needs at least [\d,.]+ GiB"):
        memory.check_fits(huge, train, 50304, torch.device("cpu"))
    # four CPU processes share the RAM: the bound is four times one process's
    free = memory.available_bytes(torch.device("cpu"))
    big = dict(model)
    while memory.train_bytes(big, train, 50304) < free / 3:  # one process fits, four do not
        big["n_layer"] *= 2
    if memory.train_bytes(big, train, 50304) < free * 0.9:
        memory.check_fits(big, train, 50304, torch.device("cpu"), processes=1)
        with pytest.raises(UserError, match="4 processes on the cpu"):
            memory.check_fits(big, train, 50304, torch.device("cpu"), processes=4)
