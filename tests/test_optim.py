import copy
import math

import pytest
import torch
from stagekit import train_config

from gptcore.distributed import DistEnv
from gptcore.model.config import ModelConfig
from gptcore.model.gpt import GPT, GPTConfig
from gptcore.params import ParamError
from gptcore.report.steplog import StepLogger
from gptcore.train.optimizers import build_optimizers
from gptcore.train.optimizers.adamw import adamw_groups
from gptcore.train.optimizers.muon import Muon
from gptcore.train.schedule import LRSchedule, lr_at
from gptcore.train.trainer import Trainer

MAX, MIN, WARM, STEPS = 6e-4, 6e-5, 715, 19073


def test_warmup_is_linear_from_one_step():
    assert lr_at(0, MAX, MIN, WARM, STEPS) == pytest.approx(MAX / WARM)
    assert lr_at(WARM - 1, MAX, MIN, WARM, STEPS) == pytest.approx(MAX)
    assert lr_at(356, MAX, MIN, WARM, STEPS) == pytest.approx(MAX * 357 / 715)


def test_cosine_decay_points():
    # half a cosine period from max_lr (warmup end) to min_lr (max_steps): its known values at the quarters,
    # (1 + cos(pi/4)) / 2 = (2 + sqrt 2) / 4 of the way down from min at a quarter, halfway at half
    lr = [lr_at(s, MAX, MIN, 10, 110) for s in range(130)]
    span = MAX - MIN
    assert lr[10] == pytest.approx(MAX)
    assert lr[35] == pytest.approx(MIN + span * (2 + math.sqrt(2)) / 4)
    assert lr[60] == pytest.approx((MAX + MIN) / 2)
    assert lr[85] == pytest.approx(MIN + span * (2 - math.sqrt(2)) / 4)
    assert all(lr[10 + k] + lr[110 - k] == pytest.approx(MAX + MIN) for k in range(101))  # odd about the middle
    assert all(lr[s] == MIN for s in range(110, 130))
    assert lr_at(STEPS, MAX, MIN, WARM, STEPS) == MIN and lr_at(WARM, MAX, MIN, WARM, STEPS) == pytest.approx(MAX)


def test_schedule_is_monotone_after_warmup():
    sched = LRSchedule(MAX, MIN, 10, 100)
    lrs = [sched(s) for s in range(10, 120)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))


def test_schedule_asserts_what_the_schema_refuses():
    # train.warmup_steps > train.max_steps is the schema's to refuse (tests/test_params.py); here it is a bug
    with pytest.raises(AssertionError):
        LRSchedule(MAX, MIN, 200, 100)


def test_wsd_warms_up_holds_then_decays_linearly_to_min():
    # 100 steps, 10 of warmup, decay over the last 30 (decay_frac 0.3): the formula, written out
    sched = LRSchedule(MAX, MIN, 10, 100, kind="wsd", decay_frac=0.3)
    assert sched(0) == pytest.approx(MAX / 10) and sched(9) == pytest.approx(MAX)
    assert all(sched(s) == MAX for s in range(10, 71))
    for s in range(70, 100):
        assert sched(s) == pytest.approx(MIN + (MAX - MIN) * (100 - s) / 30)
    assert sched(99) > MIN and sched(100) == MIN and sched(150) == MIN
    lrs = [sched(s) for s in range(70, 101)]
    assert all(a > b for a, b in zip(lrs, lrs[1:]))


# ------------------------------------------------------------------------------------------ optimizer groups

TINY = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64)
MODERN = dict(bias=False, pos_encoding="rotary", norm="rmsnorm", qk_norm=True, mlp="swiglu", tie_embeddings=False)


def tiny(seed: int = 0, **switches) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(**{**TINY, **switches}))


def names_of(model, params) -> list[str]:
    by_id = {id(p): n for n, p in model.named_parameters()}
    return sorted(by_id[id(p)] for p in params)


def test_adamw_groups_cover_every_parameter_once_with_their_rates():
    model = tiny()  # GPT-2: tied head, learned positions, biases
    groups = {g["name"]: g for g in adamw_groups(model, 0.1, 1e-3, embed_lr=2e-3, head_lr=3e-3, scalar_lr=4e-3)}
    assert list(groups) == ["embed", "head", "matrices", "scalars"]
    assert names_of(model, groups["embed"]["params"]) == ["transformer.wpe.weight"]
    assert names_of(model, groups["head"]["params"]) == ["transformer.wte.weight"]  # tied: the head's rate
    assert len(groups["matrices"]["params"]) == 2 * 4 and all(p.dim() == 2 for p in groups["matrices"]["params"])
    assert all(p.dim() == 1 for p in groups["scalars"]["params"])
    assert [(g["lr"], g["weight_decay"]) for g in groups.values()] == [(2e-3, 0.1), (3e-3, 0.1), (1e-3, 0.1),
                                                                      (4e-3, 0.0)]
    listed = [p for g in groups.values() for p in g["params"]]
    assert len({id(p) for p in listed}) == len(listed) == len(list(model.parameters()))
    untied = tiny(**MODERN)
    groups = {g["name"]: g for g in adamw_groups(untied, 0.1, 1e-3)}
    assert names_of(untied, groups["embed"]["params"]) == ["transformer.wte.weight"]
    assert names_of(untied, groups["head"]["params"]) == ["lm_head.weight"]
    assert all(g["lr"] == 1e-3 for g in groups.values())  # None: max_lr
    opt = build_optimizers(model, train_config(optimizer="adamw", max_lr=6e-4, weight_decay=0.1),
                           "cpu").optimizers["adamw"]
    assert opt.defaults.get("fused") is True  # the fused kernel on the CPU too
    assert not build_optimizers(model, train_config(optimizer="adamw", max_lr=6e-4, weight_decay=0.1),
                                "mps").optimizers["adamw"].defaults.get("fused")


def test_gpt2_with_the_adamw_a_run_builds_overfits_one_batch():
    model = tiny()  # every switch off (test_modern overfits each switch on)
    opt = build_optimizers(model, train_config(optimizer="adamw", max_lr=3e-3, weight_decay=0.0), "cpu")
    x = torch.randint(0, 64, (4, 16))
    y = torch.roll(x, -1, dims=1)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls on several threads only contend
    try:
        for _ in range(300):  # at most
            _, loss = model(x, y)
            if loss.item() < 0.05:
                break
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        torch.set_num_threads(threads)
    assert loss.item() < 0.05


def test_zero_init_head_starts_the_untied_head_at_zero():
    model = tiny(**MODERN, zero_init_head=True)
    assert not model.lm_head.weight.any() and model.transformer.wte.weight.std() > 0.01
    logits, _ = model(torch.randint(0, 64, (1, 8)))
    assert not logits.any()  # every first prediction is uniform
    with pytest.raises(ParamError, match="zero_init_head"):
        ModelConfig.read({**TINY, "zero_init_head": True})  # tied: it would zero the token table


# --------------------------------------------------------------------------- Muon per matrix, against a reference

def newton_schulz(g: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """Keller Jordan's quintic Newton-Schulz iteration (a, b, c) = (3.4445, -4.7750, 2.0315), written out here in
    float32: X <- a X + (b A + c A^2) X with A = X X^T, on the wide orientation, after scaling to norm 1."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g.float()
    tall = x.size(0) > x.size(1)
    if tall:
        x = x.T
    x = x / (x.norm() + 1e-7)
    for _ in range(steps):
        A = x @ x.T
        x = a * x + (b * A + c * A @ A) @ x
    return x.T if tall else x


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a.flatten().double(), b.flatten().double(), dim=0))


def test_muon_orthogonalises_q_k_v_and_gate_up_each_as_its_own_matrix():
    model = tiny(**MODERN)
    C = model.config.n_embd
    opt = build_optimizers(model, train_config(optimizer="muon", max_lr=1e-3, weight_decay=0.0, muon_lr=0.02,
                                               muon_momentum=0.95), "cpu")
    muon = opt.optimizers["muon"]
    assert isinstance(muon, Muon) and isinstance(muon, torch.optim.Muon)
    assert {g["name"]: g.get("row_blocks") for g in muon.param_groups} == {"muon": 1, "muon_qkv": 3,
                                                                            "muon_gate_up": 2}
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    model(torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16)))[1].backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    opt.step()
    hidden = model.config.swiglu_hidden
    cases = {  # weight -> the row slices that are matrices of their own
        "transformer.h.0.attn.c_attn.weight": [(0, C), (C, 2 * C), (2 * C, 3 * C)],
        "transformer.h.1.mlp.c_fc.weight": [(0, hidden), (hidden, 2 * hidden)],
        "transformer.h.0.attn.c_proj.weight": [(0, C)],
        "transformer.h.1.mlp.c_proj.weight": [(0, C)],
    }
    for name, slices in cases.items():
        delta = dict(model.named_parameters())[name].detach() - before[name]
        g = grads[name]
        for lo, hi in slices:
            rows, cols = hi - lo, g.size(1)
            # first step, Nesterov: the update is a multiple of the gradient; shape scale sqrt(max(1, rows/cols))
            expected = -0.02 * max(1.0, rows / cols) ** 0.5 * newton_schulz(g[lo:hi])
            assert cosine(delta[lo:hi], expected) > 0.99, (name, lo)
            torch.testing.assert_close(delta[lo:hi].norm(), expected.norm(), rtol=0.02, atol=0)
        if len(slices) > 1:  # the fused update (one Newton-Schulz of the whole tensor) is measurably different
            fused = -0.02 * max(1.0, g.size(0) / g.size(1)) ** 0.5 * newton_schulz(g)
            assert cosine(delta, fused) < 0.98, name


# ----------------------------------------------------------------- one training step against AdamW by hand

class OneBatch:
    """The loop's loader contract for one fixed batch, no accumulation."""

    grad_accum = 1

    def __init__(self, x, y):
        self.x, self.y = x, y

    def next_batch(self):
        return self.x, self.y

    def state_dict(self):
        return {}


@pytest.mark.parametrize("switches,rates", [({}, {}), (MODERN, dict(embed_lr=5e-2, head_lr=2e-3, scalar_lr=3e-2))],
                         ids=["gpt2", "untied_own_rates"])
def test_one_train_step_is_adamw_clip_and_schedule_by_hand(tmp_path, switches, rates):
    """Trainer.train_step at step 2 of warmup 4 against the formulas: lr = 3/4 of each group's peak; the global
    norm clipped to grad_clip; AdamW's first update m/(sqrt(v)+eps) with bias correction, decoupled decay of the
    2-D weights only."""
    cfg = train_config(grad_clip=0.05, weight_decay=0.1, **rates)
    model = tiny(**switches)
    reference = copy.deepcopy(model)
    x = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    y = torch.roll(x, -1, dims=1)
    env = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
    trainer = Trainer(model, OneBatch(x, y), cfg, env, tmp_path, StepLogger(tmp_path, enabled=False), {})
    trainer.step = 2
    stats = trainer.train_step()

    _, loss = reference(x, y)
    loss.backward()
    params = dict(reference.named_parameters())  # the tied matrix once
    norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in params.values()))
    assert stats["grad_norm"] == pytest.approx(float(norm), rel=1e-5) and norm > 0.05  # the clip acts
    scale = 0.05 / (float(norm) + 1e-6)
    b1, b2, eps = 0.9, 0.95, 1e-8
    tied = reference.config.tie_embeddings
    for name, p in params.items():
        peak = (rates.get("head_lr") if name == "lm_head.weight" or (tied and name == "transformer.wte.weight")
                else rates.get("embed_lr") if name in ("transformer.wte.weight", "transformer.wpe.weight")
                else rates.get("scalar_lr") if p.dim() < 2 else None) or 1e-2
        lr = peak * 3 / 4
        assert stats["lr"] == pytest.approx(1e-2 * 3 / 4)
        g = p.grad.double() * scale
        m_hat = (1 - b1) * g / (1 - b1)
        v_hat = (1 - b2) * g * g / (1 - b2)
        decay = 0.1 if p.dim() >= 2 else 0.0
        expected = p.detach().double() * (1 - lr * decay) - lr * m_hat / (v_hat.sqrt() + eps)
        got = dict(trainer.raw_model.named_parameters())[name].detach().double()
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-6, msg=name)


def test_muon_clip_false_leaves_muon_matrices_out_of_the_clip(tmp_path):
    model = tiny(**MODERN)
    x = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    y = torch.roll(x, -1, dims=1)
    reference = copy.deepcopy(model)
    reference(x, y)[1].backward()
    adamw_only = torch.sqrt(sum((p.grad.double() ** 2).sum() for n, p in reference.named_parameters()
                                if not (n.startswith("transformer.h.") and p.dim() == 2)))
    everything = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in reference.parameters()))
    env = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
    for muon_clip, norm in ((False, adamw_only), (True, everything)):
        trainer = Trainer(copy.deepcopy(model), OneBatch(x, y), train_config(optimizer="muon", muon_clip=muon_clip),
                          env, tmp_path, StepLogger(tmp_path, enabled=False), {})
        assert trainer.train_step()["grad_norm"] == pytest.approx(float(norm), rel=1e-5)
