"""The loop in one process, without the stage: when the host reads device values (syncs), and what it logs."""
import pytest
import torch

from gptcore.distributed import DistEnv
from gptcore.model.gpt import GPT, GPTConfig
from gptcore.train import memory
from gptcore.train.config import TrainConfig
from gptcore.train.memory import StepMemory
from gptcore.train.trainer import NonFiniteLoss, Trainer

CFG = dict(micro_batch=4, total_batch_tokens=64, max_steps=10, warmup_steps=2, max_lr=1e-2, dtype="float32", seed=1,
           eval_every=0, val_tokens=16, ckpt_every=1000, keep_checkpoints=1)


class Batches:
    """Fixed random batches: 4 x 16 tokens a step, one micro step."""

    grad_accum = 1

    def __init__(self, poison_at: int | None = None) -> None:
        self.i, self.poison_at = 0, poison_at
        self.data = torch.randint(0, 64, (100, 4, 17), generator=torch.Generator().manual_seed(0))

    def next_batch(self):
        b = self.data[self.i]
        self.i += 1
        return b[:, :-1], b[:, 1:]

    def state_dict(self):
        return {"i": self.i}


class Log:
    def __init__(self) -> None:
        self.rows: list[tuple[int, dict]] = []

    def log(self, step, metrics):
        self.rows.append((step, dict(metrics)))

    def log_constants(self, metrics):
        pass


def trainer(tmp_path, loader=None, **cfg) -> tuple[Trainer, Log]:
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=64))
    log = Log()
    env = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
    return Trainer(model, loader or Batches(), TrainConfig.read({**CFG, **cfg}), env, tmp_path, log, {}), log


def train_rows(log: Log) -> dict[int, dict]:
    return {s: m for s, m in log.rows if "train_loss" in m}


def test_log_every_k_logs_the_same_values_as_every_step(tmp_path):
    every, log1 = trainer(tmp_path / "a", log_every=1)
    every.fit()
    sparse, log4 = trainer(tmp_path / "b", log_every=4)
    sparse.fit()
    one, four = train_rows(log1), train_rows(log4)
    assert sorted(one) == list(range(10)) and sorted(four) == [0, 4, 8, 9]
    for step in four:
        for key in ("train_loss", "grad_norm", "lr", "tokens_seen"):
            assert four[step][key] == one[step][key], (step, key)
    assert all(four[s]["tokens_per_sec"] > 0 and four[s]["step_ms"] > 0 for s in four)


def test_the_host_reads_device_values_only_at_the_logging_cadence(tmp_path, monkeypatch):
    """Every way Python turns a tensor into a host value (item, float, int, bool, tolist) is counted per step."""
    t, log = trainer(tmp_path, log_every=5)
    reads: list[int] = []
    for name in ("item", "__float__", "__int__", "__bool__", "tolist"):
        real = getattr(torch.Tensor, name)

        def counted(self, *a, _real=real, **kw):
            reads.append(t.step)
            return _real(self, *a, **kw)
        monkeypatch.setattr(torch.Tensor, name, counted)
    t.fit()
    monkeypatch.undo()
    during_training = sorted(set(s for s in reads if s < 10))
    assert during_training == [0, 5, 9], reads  # the logged steps (and the last); none in between


def test_a_non_finite_loss_stops_before_the_next_save_and_names_its_step(tmp_path):
    t, _ = trainer(tmp_path, log_every=100, ckpt_every=2)
    model = t.model

    def poisoned(x, y=None):
        logits, loss = model(x, y)
        return logits, loss * float("nan") if t.step == 3 else loss
    t.model = poisoned
    t.model.train = lambda: None
    with pytest.raises(NonFiniteLoss, match="non-finite training loss at step 3; last good checkpoint: .*ckpt_0000002"):
        t.fit()
    assert [p.name for p in tmp_path.glob("ckpt_*")] == ["ckpt_0000002"]  # nothing after the bad step


def test_a_cuda_out_of_memory_in_a_step_is_one_line_naming_a_smaller_micro_batch(tmp_path, monkeypatch):
    t, _ = trainer(tmp_path, ckpt_every=2, max_steps=4)  # 4 sequences a step: micro_batch 4 -> try 2
    real = t.train_step

    def out_of_memory():
        if t.step == 3:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real()
    monkeypatch.setattr(t, "train_step", out_of_memory)
    with pytest.raises(StepMemory) as e:
        t.fit()
    assert str(e.value) == ("train.micro_batch=4: a training step ran out of cpu memory; try train.micro_batch=2 "
                            "(gradient accumulation keeps train.total_batch_tokens); stopped without saving "
                            "(checkpoints already written are kept)")
    assert isinstance(e.value.__cause__, torch.cuda.OutOfMemoryError)
    assert [p.name for p in tmp_path.glob("ckpt_*")] == ["ckpt_0000002"]


def test_the_cpu_allocators_refusal_is_named_too_and_other_errors_keep_their_traceback(tmp_path, monkeypatch):
    t, _ = trainer(tmp_path)
    refusal = RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 10000000000000 bytes. Error code 12 (Cannot allocate memory)")
    monkeypatch.setattr(t, "train_step", lambda: (_ for _ in ()).throw(refusal))
    with pytest.raises(StepMemory, match=r"^train.micro_batch=4: a training step ran out of cpu memory; try "
                                         r"train.micro_batch=2"):
        t.fit()
    bug = RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x16 and 32x16)")
    monkeypatch.setattr(t, "train_step", lambda: (_ for _ in ()).throw(bug))
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied") as e:
        t.fit()
    assert not isinstance(e.value, StepMemory)


def test_out_of_memory_at_micro_batch_1_says_make_the_model_smaller(tmp_path, monkeypatch):
    t, _ = trainer(tmp_path, micro_batch=1, total_batch_tokens=16, loader=Batches())

    def out_of_memory():
        raise torch.cuda.OutOfMemoryError("CUDA out of memory.")
    monkeypatch.setattr(t, "train_step", out_of_memory)
    with pytest.raises(StepMemory, match=r"^train.micro_batch=1: .* make the model smaller; stopped without saving"):
        t.fit()


def test_no_micro_batch_that_fits_stops_after_the_second_step_before_its_save(tmp_path, monkeypatch):
    monkeypatch.setattr(memory, "budget_bytes", lambda device: 1)  # one byte: not even micro_batch=1
    t, log = trainer(tmp_path, ckpt_every=1)
    with pytest.raises(StepMemory, match=r"^train.micro_batch=4: the first training steps peaked at [\d.]+ GiB of "
                                         r"the 0.00 GiB this process may use on cpu .* even train.micro_batch=1 "
                                         r"would need about [\d.]+ GiB: make the model smaller; stopped without"):
        t.fit()
    assert t.step == 1 and [p.name for p in tmp_path.glob("ckpt_*")] == ["ckpt_0000001"]


def test_the_memory_check_runs_once_and_not_where_the_budget_is_unknown(tmp_path, monkeypatch):
    budgets: list[torch.device] = []
    monkeypatch.setattr(memory, "budget_bytes", lambda device: budgets.append(device))  # None: cannot be told
    t, _ = trainer(tmp_path)
    t.fit()
    assert budgets == [torch.device("cpu")] and t.step == 10


def test_each_eval_prints_one_line_with_the_step_and_its_losses_rank_0_only(tmp_path, capsys):
    """What nanoGPT prints at each eval: the step, the last train loss and the val loss (the same figures the step
    metrics get), on a line of its own above the progress bar; ranks other than 0 print nothing."""
    t, log = trainer(tmp_path, max_steps=4, eval_every=2)
    t.evaluators = [lambda model, step: {"val_loss": 5.0 + step}]
    t.fit()
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    rows = {step: m for step, m in log.rows if "val_loss" in m}
    train = train_rows(log)
    assert said == ["step 0: val loss 5.0000", f"step 2: train loss {train[1]['train_loss']:.4f}, val loss 7.0000",
                    f"step 4: train loss {train[3]['train_loss']:.4f}, val loss 9.0000"]
    assert [s for s in rows] == [0, 2, 4]
    quiet, _ = trainer(tmp_path / "r1", max_steps=2, eval_every=2)
    quiet.env = DistEnv(rank=1, local_rank=1, world_size=1, device=torch.device("cpu"))
    quiet.evaluators = [lambda model, step: {"val_loss": 1.0}]
    quiet.fit()
    assert not [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
