"""The one model loader: every spec (scratch, HF folder, model/ folder, our checkpoints, nanoGPT, build-nanogpt),
the same rules for block size everywhere, and the tokenizer that goes with a model."""
import errno
import json
import re
import sys
import types
import zipfile

import pytest
import torch

from gptcore.data.tokenizers.char import CharTokenizer
from gptcore.errors import UserError
from gptcore.eval.sampling import main as sample_main
from gptcore.model.checkpoint_file import read_checkpoint
from gptcore.model.config import ModelConfig
from gptcore.model.export import export_model
from gptcore.model.gpt import GPT, GPTConfig
from gptcore.model.load import MODEL_FILE, init_model, load_model, tokenizer_for
from gptcore.train import checkpoints

TINY = dict(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=64)


def tiny() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(**TINY))


def same_weights(a: GPT, b: GPT) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


NANOGPT_CONFIG = """
from dataclasses import dataclass
@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50257
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
"""


def build_nanogpt_checkpoint(path, model: GPT, module: str, monkeypatch) -> None:
    """Save a checkpoint the way build-nanogpt's train_gpt2.py does: its GPTConfig dataclass pickled as is (a class
    of the module `module`, __main__ or model), the compiled model's state dict (`_orig_mod.` keys). The module is
    registered only while saving, so the loader later finds no class to import, as in another process."""
    with monkeypatch.context() as m:
        if module == "__main__":
            namespace = {"__name__": "__main__"}
        else:
            m.setitem(sys.modules, module, types.ModuleType(module))
            namespace = sys.modules[module].__dict__
        exec(NANOGPT_CONFIG, namespace)
        m.setattr(sys.modules[module], "GPTConfig", namespace["GPTConfig"], raising=False)
        cfg = namespace["GPTConfig"](block_size=16, vocab_size=64, n_layer=1, n_head=2, n_embd=16)
        sd = {"_orig_mod." + k: v for k, v in model.state_dict().items()}
        torch.save({"model": sd, "config": cfg, "step": 5, "val_loss": 3.25}, path)
    assert module not in sys.modules or not hasattr(sys.modules[module], "GPTConfig")
    with zipfile.ZipFile(path) as z:  # the pickle names the class by its module, as build-nanogpt's does
        assert f"{module}\nGPTConfig".encode() in z.read("model_00005/data.pkl")


@pytest.mark.parametrize("module", ["__main__", "model"])
def test_build_nanogpt_checkpoint_loads_without_its_class(tmp_path, module, monkeypatch):
    model = tiny()
    build_nanogpt_checkpoint(tmp_path / "model_00005.pt", model, module, monkeypatch)
    ckpt = read_checkpoint(tmp_path / "model_00005.pt")
    assert ckpt["config"] == {"block_size": 16, "vocab_size": 64, "n_layer": 1, "n_head": 2, "n_embd": 16}
    assert ckpt["step"] == 5
    assert same_weights(load_model(tmp_path / "model_00005.pt"), model)


def test_pickled_code_never_runs(tmp_path):
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    torch.save({"model": {}, "config": Evil()}, tmp_path / "evil.pt")
    with pytest.raises(UserError, match="evil.pt: not loadable as plain tensors .*GLOBAL io.open"):
        load_model(tmp_path / "evil.pt")
    assert not marker.exists()


def test_nanogpt_checkpoint_with_compile_prefix_loads(tmp_path):
    model = tiny()
    sd = {f"_orig_mod.{k}": v for k, v in model.state_dict().items()}
    torch.save({"model": sd, "model_args": dict(TINY, bias=True, dropout=0.0), "iter_num": 7}, tmp_path / "ckpt.pt")
    assert same_weights(load_model(tmp_path / "ckpt.pt"), model)


def test_every_spec_loads_the_same_weights_everywhere(tmp_path):
    """init_from, eval.model and gptcore-sample share one loader: each spec gives the same model in each."""
    model = tiny()
    folder = tmp_path / "model"
    export_model(folder, model, None, {"step": 3}, hf_vocab_size=64)
    checkpoints.save_best(tmp_path / "ckpts", 3, model.state_dict(), dict(TINY), 1.0, "run")
    ckpt = checkpoints.best_path(tmp_path / "ckpts", 3)  # best weights: a .pt file of this project
    for spec in (folder, folder / MODEL_FILE, folder / "hf", ckpt):
        assert same_weights(load_model(spec), model), spec
        assert same_weights(init_model(ModelConfig(init_from=str(spec), block_size=16), data_vocab_size=60), model)


def test_block_size_crops_when_smaller_and_refuses_when_larger(tmp_path):
    model = tiny()
    export_model(tmp_path, model, None, {"step": 1})
    for spec in (tmp_path, tmp_path / "hf"):
        small = load_model(spec, block_size=8)
        assert small.config.block_size == 8 and small.transformer.wpe.weight.shape == (8, 16)
        assert torch.equal(small.transformer.wpe.weight, model.transformer.wpe.weight[:8])
        with pytest.raises(UserError, match="block_size=17 is larger than .* 16"):
            load_model(spec, block_size=17)
        with pytest.raises(UserError, match="model.init_from=.*block_size=32 is larger"):
            init_model(ModelConfig(init_from=str(spec), block_size=32), data_vocab_size=60)
    assert load_model(tmp_path, dropout=0.1).config.dropout == 0.1


def test_bad_specs_say_what_is_accepted(tmp_path):
    with pytest.raises(UserError, match="only model.init_from starts a model from scratch"):
        load_model("scratch")
    with pytest.raises(UserError, match="'nope': no such file or folder; expected 'scratch', one of gpt2"):
        load_model("nope")
    with pytest.raises(UserError, match="neither model.pt .* nor config.json"):
        load_model(tmp_path)
    (tmp_path / "x.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(UserError, match="x.pt: cannot read checkpoint"):
        load_model(tmp_path / "x.pt")
    torch.save({"step": 1}, tmp_path / "y.pt")
    with pytest.raises(UserError, match="y.pt: not a GPT checkpoint"):
        load_model(tmp_path / "y.pt")


def test_tokenizer_comes_from_beside_the_model(tmp_path):
    tok = CharTokenizer("abcdefgh ")
    model = GPT(GPTConfig(**{**TINY, "vocab_size": 64}))
    export_model(tmp_path / "model", model, None, {"step": 1}, hf_vocab_size=tok.vocab_size)
    tok.save(tmp_path / "model")
    (tmp_path / "model" / "manifest.json").write_text(json.dumps({"tokenizer": tok.record()}))
    for spec in (tmp_path / "model", tmp_path / "model" / MODEL_FILE, tmp_path / "model" / "hf"):
        assert tokenizer_for(str(spec), model).name == "char"
    # nothing recorded beside a foreign checkpoint: GPT-2 BPE, as nanoGPT's sample.py assumes, if the model fits it
    torch.save({"model": model.state_dict(), "model_args": TINY}, tmp_path / "ckpt.pt")
    with pytest.raises(UserError, match="smaller than tokenizer gpt2's"):
        tokenizer_for(str(tmp_path / "ckpt.pt"), model)
    assert tokenizer_for(str(tmp_path / "ckpt.pt"), model, tmp_path / "model").name == "char"


def test_sample_cli_reads_the_model_folder(tmp_path, capsys):
    tok = CharTokenizer("abcdefgh ")
    model = tiny()
    export_model(tmp_path / "model", model, None, {"step": 1})
    tok.save(tmp_path / "model")
    (tmp_path / "model" / "manifest.json").write_text(json.dumps({"tokenizer": tok.record()}))
    sample_main(["--model", str(tmp_path / "model"), "--prompt", "abc", "--num-samples", "2",
                 "--max-new-tokens", "5", "--device", "cpu"])
    out = capsys.readouterr().out
    assert out.count("--- sample") == 2 and "abc" in out


def test_model_vocab_pads_auto_to_a_multiple_of_64_and_keeps_an_explicit_size():
    from gptcore.model.config import ModelConfig

    for data in (50257, 4506, 151646, 64, 1):
        assert ModelConfig(vocab_size="auto").vocab(data) == -(-data // 64) * 64
    assert ModelConfig(vocab_size=50400).vocab(50257) == 50400


def test_a_damaged_hf_folder_is_named_and_a_disk_error_is_not_called_damage(tmp_path, monkeypatch):
    import safetensors.torch

    export_model(tmp_path, tiny(), None, {"step": 1})
    weights = tmp_path / "hf" / "model.safetensors"
    whole = weights.read_bytes()
    weights.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(UserError, match=r"hf: cannot read its safetensors weights \(SafetensorError: .*\); copy the "
                                        r"folder again"):
        load_model(tmp_path / "hf")
    weights.write_bytes(whole)

    def failing(path, device="cpu"):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(safetensors.torch, "load_file", failing)
    with pytest.raises(UserError, match=r"hf: cannot read it \(EIO: Input/output error\); the file is kept") as e:
        load_model(tmp_path / "hf")
    assert "copy the folder" not in str(e.value)


def test_a_full_disk_while_fetching_gpt2_is_not_called_a_network_failure(tmp_path, monkeypatch):
    import huggingface_hub

    def full(**kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "hub" / "model.safetensors"))

    monkeypatch.setattr(huggingface_hub, "snapshot_download", full)
    with pytest.raises(UserError, match=r"model.safetensors: no space left on .*free some space") as e:
        load_model("gpt2")
    assert "cannot fetch" not in str(e.value)


def flip_a_weight(path, n: int = 64) -> None:
    """n bytes of the largest tensor in the torch.save file `path` inverted in place, as bit rot or a bad copy leaves
    them: the size and the zip layout stay, so the file still loads."""
    with zipfile.ZipFile(path) as z:
        entry = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    data = bytearray(path.read_bytes())
    head = entry.header_offset  # its local header: 30 bytes, then its name and extra field, then its bytes
    start = head + 30 + int.from_bytes(data[head + 26:head + 28], "little") + int.from_bytes(data[head + 28:head + 30],
                                                                                             "little")
    data[start:start + n] = bytes(b ^ 0xFF for b in data[start:start + n])
    path.write_bytes(bytes(data))


def test_model_pt_changed_since_its_export_is_one_line_wherever_it_is_read(tmp_path, capsys):
    """model/'s manifest records model.pt's sha256, taken as the export wrote it: bytes flipped inside a weight (the
    zip still reads) are named wherever the weights are read back, before any is used."""
    tok = CharTokenizer("abcdefgh ")
    folder = tmp_path / "model"
    export_model(folder, tiny(), tok, {"step": 1})
    manifest = json.loads((folder / "manifest.json").read_text())
    import hashlib
    assert manifest["sha256"] == {MODEL_FILE: hashlib.sha256((folder / MODEL_FILE).read_bytes()).hexdigest()}
    assert same_weights(load_model(folder), tiny())
    flip_a_weight(folder / MODEL_FILE)
    assert read_checkpoint(folder / MODEL_FILE)["step"] == 1  # still a readable torch.save file: only the digest tells
    line = (f"{folder / MODEL_FILE}: its sha256 is not the one {folder / 'manifest.json'} recorded when it was "
            f"written (the file was damaged or replaced since); export it again")
    for spec in (folder, folder / MODEL_FILE):
        with pytest.raises(UserError, match=re.escape(line)):
            load_model(spec)
        with pytest.raises(UserError, match=re.escape(f"model.init_from='{spec}': {line}")):
            init_model(ModelConfig(init_from=str(spec), block_size=16), data_vocab_size=9)
    with pytest.raises(SystemExit) as end:
        sample_main(["--model", str(folder), "--prompt", "abc", "--device", "cpu"])
    assert end.value.code == (f"[gptcore-sample] {line} (rerun train: its checkpoints are kept), or restore DVC's "
                              f"copy (dvc checkout)")


def test_a_training_checkpoint_or_one_of_its_files_is_refused_as_a_model_before_anything_is_read(tmp_path):
    """Its weights are spread over shards that only resuming reads together: one line, not a torch.load traceback."""
    from gptcore.model.load import check_spec

    folder = tmp_path / "ckpt_0000003"
    checkpoints.write(tmp_path, 3, {"model": {"w": torch.zeros(4)}}, {"step": 3})
    for spec, what in ((folder, "a training checkpoint"),
                       (folder / "__0_0.distcp", f"one file of the training checkpoint {folder}"),
                       (folder / "record.pt", f"one file of the training checkpoint {folder}")):
        with pytest.raises(UserError, match=re.escape(f"{spec}: {what}, not a model (its weights are spread")):
            check_spec(spec)
    (tmp_path / "copied.distcp").write_bytes((folder / "__0_0.distcp").read_bytes())
    with pytest.raises(UserError, match="copied.distcp: one shard of a training checkpoint, not a model"):
        load_model(tmp_path / "copied.distcp")
