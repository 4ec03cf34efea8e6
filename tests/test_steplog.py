"""The dvclive step logger across a kill: curves cut at the resume step, a summary truncated mid-write rebuilt."""
import json

from gptcore.report.curves import LiveCurves
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


def rows(path):
    return [line.split("\t") for line in path.read_text(encoding="utf-8").splitlines()[1:]]


def logged(logger, steps, tokens=256, eval_every=2):
    """What a run's loop logs at `steps`: an evaluation first where due, then the step's training figures."""
    for step in steps:
        if step % eval_every == 0:
            logger.log(step, {"val_loss": 9.0 - step, "hellaswag_acc_norm": 0.25 + step / 100})
        logger.log(step, {"train_loss": 10.0 - step, "tokens_seen": (step + 1) * tokens})


def test_the_plots_curves_keep_in_step_with_the_log(tmp_path):
    """The curves the top-level plots read follow the run as it logs: the first log and each evaluation at once,
    training steps between them when due (here: not within the hour), everything at the end."""
    live = tmp_path / "train"
    logger = StepLogger(live, also=[LiveCurves(live, tmp_path / "plots", every_s=3600)])
    logged(logger, [0])
    train, val, acc = (tmp_path / "plots" / f"{n}.tsv" for n in ("train_loss", "val_loss", "acc_norm"))
    assert rows(val) == [["0", "0", "9.0"]] and rows(acc) == [["0", "0", "hellaswag", "0.25", "0.25"]]
    assert rows(train) == []  # step 0's training figures came after its evaluation: not due yet
    logged(logger, [1])
    assert rows(train) == []  # not due: the files are rewritten at most every every_s
    logged(logger, [2])  # the evaluation at step 2 writes what came before it, the training figures too
    assert [r[0] for r in rows(train)] == ["0", "1"] and [r[:3] for r in rows(val)] == [["0", "0", "9.0"],
                                                                                        ["2", "512", "7.0"]]
    logger.close()
    assert [(r[0], r[1], r[2]) for r in rows(train)] == [("0", "256", "10.0"), ("1", "512", "9.0"),
                                                        ("2", "768", "8.0")]
    assert [r[1] for r in rows(acc)] == ["0", "512"]
    assert not list((tmp_path / "plots").glob(".*.tmp"))


def test_a_resumed_run_s_curves_drop_what_the_killed_one_logged_after_its_checkpoint(tmp_path):
    live = tmp_path / "train"
    curves = LiveCurves(live, tmp_path / "plots", every_s=3600)
    logger = StepLogger(live, also=[curves])
    logged(logger, range(6))
    curves.update(force=True)  # killed here: the curves hold steps 0..5
    plots = tmp_path / "plots"
    assert [r[0] for r in rows(plots / "train_loss.tsv")] == ["0", "1", "2", "3", "4", "5"]
    curves = LiveCurves(live, plots, every_s=3600)
    logger = StepLogger(live, resume_step=3, also=[curves])
    curves.update(force=True)  # as the run starts (Trainer.build): the steps the resumed run redoes are gone
    assert [r[0] for r in rows(plots / "train_loss.tsv")] == ["0", "1", "2"]
    assert [r[0] for r in rows(plots / "val_loss.tsv")] == ["0", "2"]  # step 4's evaluation is gone
    logged(logger, [3])  # and the first log writes the redone step
    assert [r[0] for r in rows(plots / "train_loss.tsv")] == ["0", "1", "2", "3"]
    logger.close()


def test_curves_of_a_long_run_are_written_less_often(tmp_path, monkeypatch):
    """A write that takes 0.5 s (a long run's files) waits 50 s before the next, not every_s's 10: 1% of the time."""
    from gptcore.report import curves as curves_module

    clock = [100.0]
    monkeypatch.setattr(curves_module.time, "monotonic", lambda: clock[0])
    writes = []

    def slow_write(live_dir, out_dir):
        writes.append(clock[0])
        clock[0] += 0.5

    monkeypatch.setattr(curves_module, "write_curves", slow_write)
    curves = LiveCurves(tmp_path, tmp_path, every_s=10)
    for t in (100.0, 120.0, 149.0, 151.0):
        clock[0] = t
        curves.log(0, {"train_loss": 1.0})
    assert writes == [100.0, 151.0]
    curves.log(0, {"val_loss": 1.0})  # an evaluation: at once
    assert len(writes) == 3
