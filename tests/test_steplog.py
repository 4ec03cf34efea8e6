"""The dvclive step logger across a kill: curves cut at the resume step, a summary truncated mid-write rebuilt."""
import json

from gptcore.report.steplog import StepLogger


def read_rows(live, name):
    lines = (live / "plots" / "metrics" / f"{name}.tsv").read_text(encoding="utf-8").splitlines()
    return [line.split("\t") for line in lines[1:]]


def test_resume_after_a_kill_that_truncated_the_summary(tmp_path):
    live = tmp_path / "train"
    logger = StepLogger(live)
    for step in range(5):
        logger.log(step, {"train_loss": 5.0 - step, "val_loss": 6.0 - step if step % 2 == 0 else None})
    logger.close()
    (live / "metrics.json").write_text('{"train_loss": 1.', encoding="utf-8")  # killed while dvclive wrote it
    logger = StepLogger(live, resume_step=3)
    assert [r[0] for r in read_rows(live, "train_loss")] == ["0", "1", "2"]
    assert json.loads((live / "metrics.json").read_text()) == {"train_loss": 3.0, "val_loss": 4.0, "step": 2}
    logger.log(3, {"train_loss": 1.5})
    logger.close()
    assert [r[0] for r in read_rows(live, "train_loss")] == ["0", "1", "2", "3"]
    assert json.loads((live / "metrics.json").read_text())["train_loss"] == 1.5


def test_a_rebuilt_summary_is_strict_json_where_a_curve_ends_in_nan(tmp_path):
    """The logger leaves non-finite values out, but a curve written by hand or by an older gptcore may end in nan:
    the summary rebuilt after a kill holds null there, never a bare NaN (which is not JSON)."""
    from gptcore.report.steplog import repair_summary

    live = tmp_path / "train"
    logger = StepLogger(live)
    logger.log(0, {"train_loss": 5.0, "val_loss": 6.0})
    logger.log(1, {"train_loss": 4.0})
    logger.close()
    with open(live / "plots" / "metrics" / "val_loss.tsv", "a", encoding="utf-8") as f:
        f.write("1\tnan\n")
    (live / "metrics.json").write_text('{"train_loss": 4.', encoding="utf-8")
    repair_summary(live)
    text = (live / "metrics.json").read_text()
    assert json.loads(text, parse_constant=lambda c: 1 / 0) == {"train_loss": 4.0, "val_loss": None, "step": 1}


def test_run_constants_are_counted_by_hand_and_never_a_dvc_metric(tmp_path):
    from gptcore.model.gpt import GPT, GPTConfig
    from gptcore.report.flops import model_sizes

    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64, tie_embeddings=False))
    sizes = model_sizes(model)
    # by hand: wte 64x32, lm_head 32x64, per block 2 LayerNorms (2 x 2 x 32), c_attn 32x96+96, c_proj 32x32+32,
    # c_fc 32x128+128, mlp c_proj 128x32+32; wpe 16x32; ln_f 2 x 32
    block = 2 * 2 * 32 + 32 * 96 + 96 + 32 * 32 + 32 + 32 * 128 + 128 + 128 * 32 + 32
    total = 64 * 32 + 32 * 64 + 16 * 32 + 2 * block + 2 * 32
    assert sizes["params"] == total == sum(p.numel() for p in model.parameters())
    assert sizes["params_non_embedding"] == total - 64 * 32 - 16 * 32  # token and position tables left out
    assert sizes["flops_per_token"] == 6 * (total - 64 * 32 - 16 * 32) + 12 * 2 * 2 * 16 * 16
    live, got = tmp_path / "train", []

    class Sink:  # as WandbLog: the figures go to its run summary
        def log(self, step, metrics): pass
        def log_constants(self, metrics): got.append(dict(metrics))
        def close(self): pass

    logger = StepLogger(live, also=[Sink()])
    logger.log_constants(sizes)
    logger.log(0, {"train_loss": 4.0})
    logger.close()
    assert got == [sizes]
    assert not (live / "plots" / "metrics" / "params.tsv").exists()
    summary = json.loads((live / "metrics.json").read_text(encoding="utf-8"))
    assert summary["train_loss"] == 4.0 and not set(sizes) & set(summary)  # `dvc exp show` gets no column of them
