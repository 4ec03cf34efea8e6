"""The modern recipe's switches (model and optimizer), each tested on its own (off, the model is GPT-2: test_hf_export
holds it against transformers' GPT2LMHeadModel)."""
from __future__ import annotations

import math

import pytest
import torch
from stagekit import train_config

from gptcore.model.config import ModelConfig
from gptcore.model.gpt import GPT, GPTConfig, Rotary, apply_rotary
from gptcore.params import ParamError
from gptcore.report.flops import flops_per_token
from gptcore.train.optimizers import build_optimizers, optimizer_kind
from gptcore.train.optimizers.base import Optimizers, set_lr

TINY = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64)
MODERN = dict(bias=False, pos_encoding="rotary", norm="rmsnorm", qk_norm=True, mlp="swiglu", tie_embeddings=False,
              zero_init_proj=True, logit_softcap=30.0)
# each switch on its own, then all of them
SWITCHES = [dict(pos_encoding="rotary"), dict(norm="rmsnorm"), dict(qk_norm=True), dict(mlp="relu2"),
            dict(mlp="swiglu"), dict(tie_embeddings=False), dict(zero_init_proj=True), dict(logit_softcap=5.0),
            dict(bias=False), MODERN]
IDS = ["rotary", "rmsnorm", "qk_norm", "relu2", "swiglu", "untied", "zero_init", "softcap", "no_bias", "modern"]


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny matmuls on several threads only contend (the machine's cores are shared): run these on one."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def tiny(seed: int = 0, **switches) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(**{**TINY, **switches}))


def assert_overfits(model, opt) -> None:
    """At most 150 steps on one fixed batch of 4 x 16 tokens bring the loss under 0.1 (70 to 130 steps measured)."""
    x = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(2))
    y = torch.roll(x, -1, dims=1)
    for _ in range(150):  # at most
        _, loss = model(x, y)
        if loss.item() < 0.1:
            break
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.1


@pytest.mark.parametrize("switches", SWITCHES, ids=IDS)
def test_shapes_causality_and_overfitting(switches):
    model = tiny(**switches)
    idx = torch.randint(0, 64, (3, 16), generator=torch.Generator().manual_seed(1))
    logits, _ = model(idx)
    _, loss = model(idx, idx)
    assert logits.shape == (3, 16, 64) and loss.ndim == 0
    # causality: changing token t changes no logits before t
    other = idx.clone()
    other[:, 9] = (other[:, 9] + 1) % 64
    with torch.no_grad():
        a, b = model(idx)[0], model(other)[0]
    assert torch.allclose(a[:, :9], b[:, :9], atol=1e-6) and not torch.allclose(a[:, 9:], b[:, 9:])
    # a tiny model overfits one batch
    opt = build_optimizers(model, train_config(optimizer="adamw", max_lr=3e-3, weight_decay=0.0), "cpu")
    assert_overfits(model, opt)


def test_modern_model_overfits_with_muon():
    model = tiny(**MODERN)
    opt = build_optimizers(model, train_config(optimizer="muon", max_lr=3e-3, weight_decay=0.0, muon_lr=0.02), "cpu")
    assert_overfits(model, opt)


def rotate_by_hand(x: torch.Tensor, pos: torch.Tensor, base: float) -> torch.Tensor:
    """An independent RoPE: pair channel i with i + d/2 and turn the pair (a, b) by angle pos * base^(-2i/d),
    written as the 2x2 rotation [[cos, -sin], [sin, cos]] applied pair by pair with Python floats."""
    B, H, T, d = x.shape
    out = torch.empty_like(x, dtype=torch.float64)
    for b in range(B):
        for t in range(T):
            p = float(pos[b, t]) if pos.dim() == 2 else float(pos[t])
            for i in range(d // 2):
                theta = p * base ** (-2 * i / d)
                c, s = math.cos(theta), math.sin(theta)
                a, bb = x[b, :, t, i].double(), x[b, :, t, i + d // 2].double()
                out[b, :, t, i] = c * a - s * bb
                out[b, :, t, i + d // 2] = s * a + c * bb
    return out


@pytest.mark.parametrize("per_row", [False, True])
def test_rotary_matches_a_rotation_by_hand(per_row):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 8)
    pos = torch.tensor([[0, 1, 2, 3, 4], [7, 2, 0, 9, 1]]) if per_row else torch.arange(5)
    cos, sin = Rotary(8, 10000.0)(pos)
    got = apply_rotary(x, cos, sin)
    torch.testing.assert_close(got.double(), rotate_by_hand(x, pos, 10000.0), atol=1e-5, rtol=0)
    # relative: q.k depends only on the position difference
    q, k = torch.randn(1, 1, 1, 8).expand(1, 1, 2, 8), torch.randn(1, 1, 1, 8).expand(1, 1, 2, 8)
    c, s = Rotary(8, 10000.0)(torch.tensor([3, 10]))
    c2, s2 = Rotary(8, 10000.0)(torch.tensor([13, 20]))
    d1 = (apply_rotary(q, c, s)[..., 1, :] * apply_rotary(k, c, s)[..., 0, :]).sum()
    d2 = (apply_rotary(q, c2, s2)[..., 1, :] * apply_rotary(k, c2, s2)[..., 0, :]).sum()
    torch.testing.assert_close(d1, d2, atol=1e-5, rtol=0)


@pytest.mark.parametrize("pos_encoding", ["learned", "rotary"])
def test_hidden_states_honour_explicit_positions(pos_encoding):
    """Packed rows (the eval fast path): a sequence placed mid-row with its own position ids 0.. and a mask that
    hides the rest scores as it does alone."""
    model = tiny(pos_encoding=pos_encoding, **({"norm": "rmsnorm"} if pos_encoding == "rotary" else {})).eval()
    seq = torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(3))
    row = torch.cat([torch.randint(0, 64, (1, 4)), seq], dim=1)
    pos = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 4, 5]])
    seg = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 1, 1])
    mask = (seg[:, None] == seg[None, :]) & torch.ones(10, 10, dtype=torch.bool).tril()
    with torch.no_grad():
        alone = model.hidden_states(seq)
        packed = model.hidden_states(row, pos, mask[None, None])
    torch.testing.assert_close(packed[:, 4:], alone, atol=1e-5, rtol=0)


def test_mlp_sizes_and_param_counts():
    g, s = GPTConfig(n_embd=768), GPTConfig(n_embd=128, n_head=4)
    assert g.swiglu_hidden == 2048 and s.swiglu_hidden == 320
    sizes = dict(n_layer=1, n_head=4, n_embd=128, vocab_size=64, block_size=16)
    gelu, swiglu = GPT(GPTConfig(**sizes)), GPT(GPTConfig(**sizes, mlp="swiglu"))
    assert swiglu.transformer.h[0].mlp.c_fc.weight.shape == (2 * 320, 128)
    assert swiglu.transformer.h[0].mlp.c_proj.weight.shape == (128, 320)
    n_gelu = sum(p.numel() for p in gelu.transformer.h[0].mlp.parameters())
    n_swiglu = sum(p.numel() for p in swiglu.transformer.h[0].mlp.parameters())
    assert abs(n_swiglu - n_gelu) / n_gelu < 0.1  # comparable parameter count (122,880 + biases vs 131,072)


def test_untied_head_flops_and_zero_init():
    tied, untied = tiny(), tiny(tie_embeddings=False)
    assert untied.lm_head.weight is not untied.transformer.wte.weight
    assert untied.get_num_params(non_embedding=False) == tied.get_num_params(non_embedding=False) + 64 * 32
    # the token table of an untied model is a lookup, not compute; lm_head is compute either way
    assert untied.get_num_params() == tied.get_num_params()
    assert flops_per_token(untied) == flops_per_token(tied)
    rotary = tiny(pos_encoding="rotary")
    assert rotary.get_num_params() == tied.get_num_params()  # no position table to leave out
    z = tiny(zero_init_proj=True)
    for block in z.transformer.h:
        assert not block.attn.c_proj.weight.any() and not block.mlp.c_proj.weight.any()
        assert block.attn.c_attn.weight.std() > 0.01


def test_logit_softcap_bounds_logits_everywhere():
    model = tiny(logit_softcap=2.0)
    with torch.no_grad():
        model.lm_head.weight.mul_(100)
    idx = torch.randint(0, 64, (2, 16))
    logits = model(idx)[0]
    assert logits.abs().max() <= 2.0 and logits.abs().max() > 1.9
    h = model.hidden_states(idx)
    torch.testing.assert_close(model.logits(h), 2.0 * torch.tanh(model.lm_head(h) / 2.0))
    out = model.generate(idx[:, :4], 3, temperature=0)  # sampling goes through the cap as well
    assert out.shape == (2, 7)


def test_the_schema_rejects_unknown_switch_values():
    for bad in (dict(pos_encoding="alibi"), dict(norm="batchnorm"), dict(mlp="geglu"), dict(logit_softcap=0),
                dict(qk_norm="yes"), dict(rope_base=1), dict(pos_encoding="rotary", n_head=4, n_embd=20)):
        with pytest.raises(ParamError, match=r"^model\."):
            ModelConfig.read({**TINY, **bad})


def test_muon_gets_the_blocks_matrices_and_adamw_the_rest():
    model = tiny(**{**MODERN, "bias": True})
    opt = build_optimizers(model, train_config(optimizer="muon", max_lr=3e-3, weight_decay=0.1, muon_lr=0.02,
                                               muon_momentum=0.9), "cpu")
    assert isinstance(opt, Optimizers) and list(opt.optimizers) == ["adamw", "muon"]
    assert isinstance(opt.optimizers["muon"], torch.optim.Muon)
    names = {id(p): n for n, p in model.named_parameters()}
    muon = sorted(names[id(p)] for g in opt.optimizers["muon"].param_groups for p in g["params"])
    adamw = sorted(names[id(p)] for g in opt.optimizers["adamw"].param_groups for p in g["params"])
    expected_muon = sorted(f"transformer.h.{i}.{m}.weight" for i in range(2)
                           for m in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"))
    assert muon == expected_muon
    assert "transformer.wte.weight" in adamw and "lm_head.weight" in adamw
    assert any("q_norm" in n for n in adamw) and any(n.endswith("bias") for n in adamw)
    assert not set(muon) & set(adamw) and len(muon) + len(adamw) == len(names)
    group = opt.optimizers["muon"].param_groups[0]
    assert group["lr"] == 0.02 and group["momentum"] == 0.9 and group["nesterov"]
    # the schedule scales both optimizers' rates by the same factor
    set_lr(opt, 1.5e-3, 3e-3)
    assert group["lr"] == pytest.approx(0.01)
    assert all(g["lr"] == 1.5e-3 for g in opt.optimizers["adamw"].param_groups)


def test_optimizers_state_round_trip():
    model = tiny(**MODERN)
    opt = build_optimizers(model, train_config(optimizer="muon", max_lr=3e-3, weight_decay=0.0), "cpu")
    model(torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16)))[1].backward()
    opt.step()
    state = opt.state_dict()
    assert set(state) == {"adamw", "muon"} and state["muon"]["state"]
    fresh = build_optimizers(tiny(**MODERN), train_config(optimizer="muon", max_lr=3e-3, weight_decay=0.0), "cpu")
    fresh.load_state_dict(state)
    assert fresh.state_dict()["muon"]["state"][0]["momentum_buffer"].equal(state["muon"]["state"][0]["momentum_buffer"])
    with pytest.raises(ValueError, match="optimizer state holds"):
        build_optimizers(tiny(**MODERN), train_config(optimizer="adamw", max_lr=3e-3, weight_decay=0.0),
                         "cpu").load_state_dict(state)
    with pytest.raises(ParamError, match="train.optimizer='sgd': must be one of adamw, muon"):
        optimizer_kind(train_config(optimizer="sgd"))  # where the run picks its optimizer, before any weights


# ---------------------------------------------------------------------------------------------
# export to transformers

@pytest.mark.parametrize("switches,arch", [
    (dict(qk_norm=False, tie_embeddings=False), "llama"),
    (dict(qk_norm=False, tie_embeddings=True), "llama"),
    (dict(qk_norm=True, tie_embeddings=False), "qwen3"),
], ids=["llama_untied", "llama_tied", "qwen3"])
def test_export_loads_in_transformers_with_the_same_logits(tmp_path, switches, arch):
    transformers = pytest.importorskip("transformers")
    from gptcore.model.hf import export_hf

    model = tiny(**{**MODERN, "logit_softcap": None, "zero_init_proj": False, "rope_base": 500.0, **switches})
    with torch.no_grad():  # trained-looking norm gains, so a swapped or missing gain would show
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)
    assert export_hf(model, tmp_path / "hf", vocab_size=60) == arch
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", torch_dtype=torch.float32).eval()
    assert hf.config.model_type == arch
    idx = torch.randint(0, 60, (2, 16), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        theirs = hf(idx).logits
        ours = model.eval()(idx)[0][..., :60]
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=0)


@pytest.mark.parametrize("switches,reason", [
    (dict(), "logit soft-cap"),
    (dict(logit_softcap=None, mlp="relu2"), "mlp relu2"),
    (dict(logit_softcap=None, norm="layernorm"), "norm layernorm"),
    (dict(logit_softcap=None, bias=True), "biases"),
    (dict(logit_softcap=None, pos_encoding="learned"), "learned positions"),
])
def test_export_refuses_what_no_architecture_represents(tmp_path, switches, reason):
    from gptcore.errors import NotRepresentable
    from gptcore.model.export import NOT_EXPORTED, export_model
    from gptcore.model.hf import export_hf
    from gptcore.model.load import load_model

    model = tiny(**{**MODERN, **switches})
    with pytest.raises(NotRepresentable, match=reason) as e:
        export_hf(model, tmp_path / "x")
    assert "\n" not in str(e.value)
    # the train stage's final save keeps our format and says why there is no export
    export_model(tmp_path / "model", model, None, {"step": 1})
    note = (tmp_path / "model" / "hf" / NOT_EXPORTED).read_text()
    assert reason in note and len(note.splitlines()) == 1
    idx = torch.randint(0, 64, (1, 8))
    assert torch.equal(load_model(tmp_path / "model")(idx)[0], model(idx)[0])


# ---------------------------------------------------------------------------------------------
# everything else that works for GPT-2 works for the modern model

def test_multiple_choice_fast_path_scores_a_modern_model_as_one_forward_per_example():
    """HellaSwag and cloze pack several examples per row with explicit position ids: rotary, QK-norm and the
    soft-cap must give the same losses as scoring each example alone."""
    from reference_scorer import score_examples_reference
    from test_multichoice import assert_same, random_examples

    from gptcore.eval.scorer import score_examples

    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=64, vocab_size=128, n_layer=2, n_head=2, n_embd=32,
                          **{**MODERN, "zero_init_proj": False, "logit_softcap": 3.0})).eval()
    examples = random_examples(40)
    ref = score_examples_reference(model, examples, 128)
    fast = score_examples(model, examples, 128, device="cpu", batch_size=8, progress=False)
    assert_same(ref, fast)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_compiled_modern_model_matches_eager_in_bf16_and_trains_with_muon():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=4, n_embd=128, block_size=64, vocab_size=512, **MODERN)).cuda()
    with torch.no_grad():  # zero-init projections would hide the attention path
        for block in model.transformer.h:
            block.attn.c_proj.weight.normal_(0, 0.02)
            block.mlp.c_proj.weight.normal_(0, 0.02)
    idx = torch.randint(0, 512, (4, 64), device="cuda")
    compiled = torch.compile(model)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        eager, fast = model(idx)[0].float(), compiled(idx)[0].float()
    torch.testing.assert_close(fast, eager, atol=0.05, rtol=0.05)
    opt = build_optimizers(model, train_config(optimizer="muon", max_lr=3e-3, weight_decay=0.0), "cuda")
    losses = []
    for _ in range(30):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = compiled(idx, idx)[1]
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 1.0
