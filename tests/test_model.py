"""GPT-2 model: Hugging Face parity (import/export), size, causality, optimizer groups, sampling, MFU."""

import json
import math
import re

import pytest
import torch
from stagekit import train_config

from gptcore.errors import UserError
from gptcore.model.checkpoint_file import strip_prefixes
from gptcore.model.gpt import GPT, BadModelConfig, GPTConfig, file_config
from gptcore.model.hf import load_hf_gpt2, save_hf_gpt2
from gptcore.model.load import load_model
from gptcore.report.flops import device_peak_flops as peak_flops
from gptcore.report.flops import flops_per_token, peak_flops_for_name
from gptcore.train.optimizers import build_optimizers

TINY = dict(block_size=64, vocab_size=100, n_layer=2, n_head=2, n_embd=64)


def tiny_gpt(**overrides) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(**{**TINY, **overrides})).eval()


@pytest.fixture(scope="module")
def transformers():
    tf = pytest.importorskip("transformers", reason="transformers (test extra) is needed for the parity tests")
    tf.logging.set_verbosity_error()
    return tf


@pytest.fixture(scope="module")
def hf_model(transformers):
    """A small random Hugging Face GPT-2 (built offline), in eval mode."""
    torch.manual_seed(1234)
    # weights 10x GPT-2's init scale: activations of order 1, where e.g. tanh-GELU and exact GELU differ
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=64, n_positions=64, vocab_size=100,
                                  initializer_range=0.2)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # non-trivial LayerNorm gains and biases, so a mix-up of them cannot pass
        for name, p in hf.named_parameters():
            if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                p.uniform_(0.5, 1.5)
            elif name.endswith(".bias"):
                p.normal_(0.0, 0.02)
    return hf


@pytest.fixture(scope="module")
def hf_dir(hf_model, tmp_path_factory):
    d = tmp_path_factory.mktemp("hf_gpt2")
    hf_model.save_pretrained(d)
    return d


def tokens(batch=2, T=24, vocab=100, seed=0):
    return torch.randint(0, vocab, (batch, T), generator=torch.Generator().manual_seed(seed))


def hf_logits(hf, idx):
    with torch.no_grad():
        return hf(idx).logits


def our_logits(model, idx):
    with torch.no_grad():
        return model(idx)[0]


# ---------------------------------------------------------------------------- Hugging Face parity


def test_import_matches_hf_logits(hf_model, hf_dir):
    model = load_hf_gpt2(hf_dir).eval()
    assert model.config == GPTConfig(block_size=64, vocab_size=100, n_layer=2, n_head=2, n_embd=64)
    assert model.lm_head.weight is model.transformer.wte.weight
    idx = tokens()
    torch.testing.assert_close(our_logits(model, idx), hf_logits(hf_model, idx), atol=1e-4, rtol=0)


def test_export_loads_in_hf_with_same_logits(transformers, hf_dir, tmp_path):
    model = load_hf_gpt2(hf_dir).eval()
    save_hf_gpt2(model, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["model_type"] == "gpt2" and cfg["architectures"] == ["GPT2LMHeadModel"]
    assert (cfg["n_positions"], cfg["n_ctx"], cfg["n_embd"], cfg["n_layer"], cfg["n_head"]) == (64, 64, 64, 2, 2)
    assert cfg["activation_function"] == "gelu_new" and cfg["layer_norm_epsilon"] == 1e-5
    hf2, info = transformers.GPT2LMHeadModel.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    idx = tokens(seed=1)
    torch.testing.assert_close(hf_logits(hf2.eval(), idx), our_logits(model, idx), atol=1e-4, rtol=0)
    # no temporary files left behind by the atomic writes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]


def test_export_import_round_trip_is_exact(tmp_path):
    model = tiny_gpt()
    save_hf_gpt2(model, tmp_path)
    again = load_hf_gpt2(tmp_path)
    assert again.config == model.config
    ours, theirs = model.state_dict(), again.state_dict()
    assert ours.keys() == theirs.keys()
    for k in ours:
        assert torch.equal(ours[k], theirs[k]), k
    # exporting twice over the same directory replaces the files
    save_hf_gpt2(model, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]


def test_export_trims_padded_vocab(transformers, tmp_path):
    model = tiny_gpt(vocab_size=128)  # 100 real tokens padded to 128
    save_hf_gpt2(model, tmp_path, vocab_size=100)
    assert json.loads((tmp_path / "config.json").read_text())["vocab_size"] == 100
    back = load_hf_gpt2(tmp_path)
    assert back.config.vocab_size == 100
    assert torch.equal(back.transformer.wte.weight, model.transformer.wte.weight[:100])
    idx = tokens(seed=2)
    expected = our_logits(model, idx)[..., :100]
    torch.testing.assert_close(our_logits(back.eval(), idx), expected, atol=1e-5, rtol=0)
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    torch.testing.assert_close(hf_logits(hf, idx), expected, atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="vocab_size"):
        save_hf_gpt2(model, tmp_path, vocab_size=129)


def test_import_pytorch_bin_without_prefix_and_with_mask_buffers(hf_model, tmp_path):
    # the older layout: pytorch_model.bin, HF's attn.bias / attn.masked_bias buffers, GPT2Model keys (no
    # "transformer." prefix) plus an explicit (tied) lm_head.weight
    state = {}
    for k, v in hf_model.state_dict().items():
        state[k.removeprefix("transformer.")] = v.clone()
    for i in range(2):
        state[f"h.{i}.attn.bias"] = torch.tril(torch.ones(1, 1, 64, 64))
        state[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    state["lm_head.weight"] = state["wte.weight"].clone()
    torch.save(state, tmp_path / "pytorch_model.bin")
    hf_model.config.to_json_file(tmp_path / "config.json")
    model = load_hf_gpt2(tmp_path).eval()
    idx = tokens(seed=3)
    torch.testing.assert_close(our_logits(model, idx), hf_logits(hf_model, idx), atol=1e-4, rtol=0)


def test_import_bad_inputs(hf_dir, tmp_path):
    with pytest.raises(UserError, match="neither a local"):
        load_hf_gpt2(tmp_path / "nope")
    with pytest.raises(UserError, match="config.json"):
        load_hf_gpt2(tmp_path)
    (tmp_path / "config.json").write_text((hf_dir / "config.json").read_text())
    with pytest.raises(UserError, match="model.safetensors"):
        load_hf_gpt2(tmp_path)
    cfg = json.loads((hf_dir / "config.json").read_text())
    cfg["activation_function"] = "relu"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError, match="activation_function"):
        load_hf_gpt2(tmp_path)
    cfg["activation_function"] = "gelu_new"
    cfg["n_embd"] = 32  # weights no longer fit the config
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "model.safetensors").write_bytes((hf_dir / "model.safetensors").read_bytes())
    with pytest.raises(UserError, match="shape"):
        load_hf_gpt2(tmp_path)


def test_named_gpt2_offline_gives_clear_error(monkeypatch):
    huggingface_hub = pytest.importorskip("huggingface_hub")

    def offline(*args, **kwargs):
        raise OSError("We couldn't connect to 'https://huggingface.co'")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(UserError) as err:
        load_hf_gpt2("gpt2")
    message = str(err.value)
    assert "openai-community/gpt2" in message and "hf download" in message and "\n" not in message
    assert "give that folder instead of 'gpt2'" in message


def test_bias_free_model_cannot_export(tmp_path):
    with pytest.raises(ValueError, match="bias=False"):
        save_hf_gpt2(tiny_gpt(bias=False), tmp_path)
    assert not (tmp_path / "config.json").exists()


# ---------------------------------------------------------------------------- architecture


def test_gpt2_124m_parameter_count():
    with torch.device("meta"):
        model = GPT(GPTConfig(block_size=1024, vocab_size=50257, n_layer=12, n_head=12, n_embd=768))
    assert sum(p.numel() for p in model.parameters()) == 124_439_808
    assert model.get_num_params(non_embedding=False) == 124_439_808
    assert model.get_num_params() == 124_439_808 - 1024 * 768
    # PaLM estimate: 6N + 12 L H Q T
    assert flops_per_token(model) == 6 * (124_439_808 - 1024 * 768) + 12 * 12 * 12 * 64 * 1024


def test_parameter_names_match_hf_layout():
    names = set(tiny_gpt().state_dict())
    for n in ("transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight", "lm_head.weight",
              "transformer.h.1.ln_1.bias", "transformer.h.1.attn.c_attn.weight", "transformer.h.1.attn.c_proj.bias",
              "transformer.h.1.ln_2.weight", "transformer.h.1.mlp.c_fc.weight", "transformer.h.1.mlp.c_proj.weight"):
        assert n in names
    assert not any("attn.bias" in n and "c_attn" not in n for n in names)  # no causal-mask buffer


def test_init_statistics():
    model = GPT(GPTConfig(block_size=64, vocab_size=512, n_layer=8, n_head=4, n_embd=256))
    resid_std = 0.02 / math.sqrt(2 * 8)
    for name, p in model.named_parameters():
        if name.endswith("c_proj.weight"):
            assert p.std().item() == pytest.approx(resid_std, rel=0.05), name
        elif name.endswith(("c_attn.weight", "c_fc.weight", "wte.weight", "wpe.weight")):
            assert p.std().item() == pytest.approx(0.02, rel=0.05), name
        elif name.endswith(".bias"):
            assert torch.count_nonzero(p) == 0, name
        elif "ln_" in name:
            assert torch.all(p == 1), name


def test_causality():
    model = tiny_gpt()
    idx = tokens(batch=1, T=32)
    base = our_logits(model, idx)
    for t in (0, 7, 30):
        changed = idx.clone()
        changed[0, t + 1] = (changed[0, t + 1] + 1) % 100
        out = our_logits(model, changed)
        assert torch.equal(out[0, : t + 1], base[0, : t + 1])
        assert not torch.allclose(out[0, t + 1], base[0, t + 1])


def test_forward_loss_and_hidden_states():
    model = tiny_gpt()
    idx, targets = tokens(T=16), tokens(T=16, seed=9)
    logits, _ = model(idx)
    none, loss = model(idx, targets)
    assert logits.shape == (2, 16, 100) and none is None  # with targets the logits are never materialised
    assert loss.item() == pytest.approx(
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten()).item())
    # -1 targets are ignored: equal to the loss over the rest
    masked = targets.clone()
    masked[:, :8] = -1
    _, loss_masked = model(idx, masked)
    expected = torch.nn.functional.cross_entropy(logits[:, 8:].flatten(0, 1), targets[:, 8:].flatten())
    assert loss_masked.item() == pytest.approx(expected.item(), rel=1e-5)
    # no targets: logits for every position, loss None
    logits2, none = model(idx)
    assert none is None and logits2.shape == (2, 16, 100)
    # hidden_states is the trunk; lm_head on it gives the logits
    h = model.hidden_states(idx)
    assert h.shape == (2, 16, 64)
    torch.testing.assert_close(model.lm_head(h[:, 5]), logits2[:, 5])
    with pytest.raises(ValueError, match="block_size"):
        model(tokens(T=65))


def test_crop_block_size():
    model = tiny_gpt()
    idx = tokens(T=16)
    before = our_logits(model, idx)
    model.crop_block_size(16)
    assert model.config.block_size == 16 and model.transformer.wpe.weight.shape == (16, 64)
    torch.testing.assert_close(our_logits(model, idx), before, atol=0, rtol=0)
    with pytest.raises(ValueError, match="block_size"):
        model(tokens(T=17))
    with pytest.raises(ValueError, match="block_size"):
        model.crop_block_size(32)


def test_a_config_read_from_a_file_is_checked_by_the_model_schema(tmp_path):
    """The loader checks a file's config by the rules params.yaml's model: section gets, and refuses it with one
    BadModelConfig naming the field."""
    for bad, says in ((dict(n_embd=100, n_head=3), "model.n_embd=100: must be divisible by model.n_head=3"),
                      (dict(dropout=1.5), "model.dropout=1.5: must be a number >= 0 and < 1"),
                      (dict(vocab_size=0), "model.vocab_size=0: must be an integer >= 1"),
                      (dict(vocab_size="auto"), "model.vocab_size='auto': must be an integer >= 1")):
        with pytest.raises(BadModelConfig, match=re.escape(says)):
            file_config({**TINY, **bad}, "ckpt.pt")
    assert file_config({**TINY, "flash": True}, "ckpt.pt") == GPTConfig(**TINY)  # nanoGPT's extra keys are dropped
    torch.save({"model": {}, "model_config": {**TINY, "n_head": 3}}, tmp_path / "ckpt.pt")
    with pytest.raises(BadModelConfig, match=re.escape(f"{tmp_path / 'ckpt.pt'}: its model config makes no GPT: "
                                                       f"model.n_embd=64: must be divisible by model.n_head=3")):
        load_model(tmp_path / "ckpt.pt")


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@cuda
def test_cuda_matches_cpu_and_trains_in_bf16():
    model = tiny_gpt()
    idx = tokens(T=32)
    cpu_logits = our_logits(model, idx)
    model = model.cuda()
    idx_cuda = idx.cuda()
    torch.testing.assert_close(our_logits(model, idx_cuda).cpu(), cpu_logits, atol=1e-4, rtol=0)
    opt = build_optimizers(model, train_config(optimizer="adamw", max_lr=1e-3, weight_decay=0.1),
                           "cuda").optimizers["adamw"]
    assert opt.defaults.get("fused") is True
    model.train()
    losses = []
    for _ in range(5):  # the same batch: the loss must fall
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits, _ = model(idx_cuda)
            _, loss = model(idx_cuda, idx_cuda.roll(-1, dims=1))
        assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    out = model.generate(idx_cuda[:, :4], 8, vocab_limit=90, generator=torch.Generator("cuda").manual_seed(0))
    assert out.shape == (2, 12) and out.device.type == "cuda" and out.max() < 90


@cuda
def test_cuda_compiled_model_matches_eager_and_its_state_dict_loads():
    model = tiny_gpt().cuda()
    compiled = torch.compile(model)
    idx = tokens(T=32).cuda()
    torch.testing.assert_close(our_logits(compiled, idx), our_logits(model, idx), atol=1e-4, rtol=1e-4)
    sd = compiled.state_dict()
    assert all(k.startswith("_orig_mod.") for k in sd)
    fresh = GPT(model.config)
    fresh.load_state_dict(strip_prefixes(sd))
    assert torch.equal(fresh.lm_head.weight, model.lm_head.weight.cpu())


def test_a_device_name_gets_its_own_part_s_peak_never_a_slice_s_or_a_guess():
    """The most specific name wins (an H100 PCIe is not the SXM part); a MIG slice and an unknown card get none, so
    no MFU is made up."""
    sxm, pcie = peak_flops_for_name("NVIDIA H100 80GB HBM3"), peak_flops_for_name("NVIDIA H100 PCIe")
    assert sxm is not None and pcie is not None and pcie < sxm
    assert peak_flops_for_name("NVIDIA H100 80GB HBM3 MIG 1g.10gb") is None
    assert peak_flops_for_name("NVIDIA GeForce GTX 1080") is None and peak_flops_for_name("NVIDIA A1000") is None


def test_no_peak_flops_off_cuda_so_no_made_up_mfu():
    assert peak_flops("cpu") is None and peak_flops(torch.device("cpu")) is None
