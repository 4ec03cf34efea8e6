"""Precision (gptcore.distributed): the bf16 fallback on CPUs without it, and autocast, as every entry point uses."""
import json

import pytest
import torch

from gptcore.data.tokenizers.char import CharTokenizer
from gptcore.device import autocast_context, resolve_dtype
from gptcore.eval.sampling import main as sample_main
from gptcore.model.export import export_model
from gptcore.model.gpt import GPT, GPTConfig

CPU = torch.device("cpu")


def cpu_bf16(monkeypatch, native: bool) -> None:
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: native)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: native)


def test_names_and_the_cpu_fallback(monkeypatch):
    assert resolve_dtype("float32", CPU) == torch.float32 and resolve_dtype("float16", CPU) == torch.float16
    cpu_bf16(monkeypatch, native=False)
    assert resolve_dtype("bfloat16", CPU) == torch.float32  # emulated bf16 is only slower
    cpu_bf16(monkeypatch, native=True)
    assert resolve_dtype("bfloat16", CPU) == torch.bfloat16


def test_autocast_only_below_fp32():
    assert not isinstance(autocast_context(CPU, torch.float32), torch.autocast)
    assert not isinstance(autocast_context(CPU, None), torch.autocast)
    ctx = autocast_context(CPU, torch.bfloat16)
    assert isinstance(ctx, torch.autocast) and ctx.fast_dtype == torch.bfloat16


@pytest.mark.parametrize("native", [False, True])
def test_sampling_cli_resolves_bf16_like_train_and_evaluate(tmp_path, monkeypatch, capsys, native):
    tok = CharTokenizer("abc ")
    export_model(tmp_path, GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=8)), None,
                 {"step": 1})
    tok.save(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"tokenizer": tok.record()}))
    cpu_bf16(monkeypatch, native)
    seen = []
    real = torch.autocast

    def recording_autocast(device_type, dtype=None, **kw):
        seen.append(dtype)
        return real(device_type, dtype=dtype, **kw)

    monkeypatch.setattr(torch, "autocast", recording_autocast)
    sample_main(["--model", str(tmp_path), "--prompt", "ab", "--num-samples", "1", "--max-new-tokens", "3",
                 "--device", "cpu", "--dtype", "bfloat16"])
    assert seen == ([torch.bfloat16] if native else [])
    assert "--- sample 0 ---" in capsys.readouterr().out
