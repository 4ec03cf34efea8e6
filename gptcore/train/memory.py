"""Whether a training run fits its device's memory: an estimate built from what the model is measured to keep for
backward, checked before anything is allocated (`check_fits`), then the first two steps' measured peak (`FirstSteps`);
docs/resume-and-failures.md says what each counts."""
from __future__ import annotations

import os
import re
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Iterable, Iterator

import psutil
import torch

from gptcore.distributed import all_gather_objects
from gptcore.errors import UserError
from gptcore.model.config import ModelConfig
from gptcore.model.gpt import GPTConfig
from gptcore.model.lm_loss import loss_chunk_rows
from gptcore.train.config import TrainConfig
from gptcore.train.optimizers import optimizer_kind
from gptcore.train.parallel import MODES, ParallelMode, local

GIB = 1 << 30
# a first step may peak at most this share of the memory the process may use: later steps, evals and the allocator's
# fragmentation need some room, and a step that only just fitted once can be killed the next time
FILL = 0.9
CPU_OUT_OF_MEMORY = "DefaultCPUAllocator: can't allocate memory"  # a RuntimeError, not torch's OutOfMemoryError


class StepMemory(UserError):
    """A training step does not fit (or ran out of) the device's memory at this train.micro_batch."""


def matrix_params(model: GPTConfig, vocab_size: int) -> int:
    """Weights in the matrices of a scratch model of this shape (vocab_size already padded)."""
    heads = 1 if model.tie_embeddings else 2
    return model.n_layer * block_params(model) + heads * vocab_size * model.n_embd


def block_params(model: GPTConfig) -> int:
    """Weights in one block's matrices: attention 4 n_embd^2; the MLP 8 n_embd^2 (GELU, ReLU^2) or 3 n_embd x its
    hidden width (SwiGLU)."""
    c = model.n_embd
    mlp = 3 * c * model.swiglu_hidden if model.mlp == "swiglu" else 8 * c * c
    return 4 * c * c + mlp


def act_bytes(train: TrainConfig) -> int:
    """Bytes a value autocast computes in: 4 under float32 (no autocast), 2 under bfloat16 or float16."""
    return 4 if train.dtype == "float32" else 2


def saved_per_token_block(model: GPTConfig, act: int) -> int:
    """Bytes one block keeps for its backward per token, with autocast computing in `act` bytes (4: float32). Counted
    tensor by tensor with saved-tensor hooks (bench/bench_memory.py prints the count beside this formula; a test holds
    them equal): the residual stream stays fp32, so each norm keeps its fp32 input; c_attn's input, q, k, v, the
    attention output (c_proj's input) and c_fc's input are kept at `act` bytes, and attention's logsumexp in fp32 a
    head. GPT-2 under bf16: 36 n_embd + 16 + 4 n_head; under fp32: 64 n_embd + 16 + 4 n_head. torch.compile keeps as
    much for GPT-2 and less for the modern switches (RMSNorm and QK-norm fused): this eager count bounds it."""
    c, h = model.n_embd, model.n_head
    n = 2 * 4 * c + 6 * act * c + 4 * h
    # a LayerNorm keeps its mean and rstd; torch's RMSNorm (a composite on the CPU) its rstd and the normalised copy
    n += 2 * (8 if model.norm == "layernorm" else 4 * c + 4)
    # the MLP keeps its activation's input and c_proj's input; SwiGLU also the gate's SiLU (4 x its hidden width)
    n += act * (4 * model.swiglu_hidden if model.mlp == "swiglu" else 2 * 4 * c)
    if model.qk_norm:  # the normalised q and k and their fp32 intermediates (rotation included): measured
        n += (24 - act) * c + 8 * h
    elif model.pos_encoding == "rotary":  # each of q and k rotated: the rotated half-swap kept for the sine's product
        n += 2 * act * c
    return n


def saved_per_token_outside(model: GPTConfig) -> int:
    """Bytes a token keeps for backward outside the blocks: its id (int64), the final norm's fp32 input and
    statistics, and the gradient of that norm's output the LM head's loss makes in its forward (fp32)."""
    c = model.n_embd
    return 8 + (4 * c + 8 if model.norm == "layernorm" else 8 * c + 4) + 4 * c


def loss_working_bytes(model: GPTConfig, vocab_size: int, tokens: int, act: int, device_type: str) -> int:
    """What the LM head's chunked loss (gptcore/model/lm_loss.py) holds at once besides what it keeps: one chunk's
    fp32 logits, logsumexp's temporary and (under autocast) their gradient cast down, and the autocast copies of the
    head and of the hidden states."""
    rows = loss_chunk_rows(device_type, vocab_size, model.n_embd) or tokens
    chunk = min(rows, tokens) * vocab_size
    copies = act * (vocab_size * model.n_embd + tokens * model.n_embd) if act < 4 else 0
    return chunk * (8 + (act if act < 4 else 0)) + copies


def activation_bytes(model: GPTConfig, train: TrainConfig, vocab_size: int, mode: ParallelMode = MODES["ddp"],
                     device_type: str = "cuda") -> int:
    """What one micro-batch's forward holds at its end for its backward: the measured per-token terms
    (`saved_per_token_block`, `saved_per_token_outside`); the head's fp32 gradient, which the LM loss makes in its
    forward; under autocast the blocks' weights cast down once a step (none where the mode gathers them already cast:
    a sharded mode); and the LM loss's working memory (`loss_working_bytes`)."""
    act, tokens = act_bytes(train), train.micro_batch * model.block_size
    saved = tokens * (model.n_layer * saved_per_token_block(model, act) + saved_per_token_outside(model))
    copies = act * model.n_layer * block_params(model) if act < 4 and not mode.sharded else 0
    head_grad = 4 * vocab_size * model.n_embd
    return saved + head_grad + copies + loss_working_bytes(model, vocab_size, tokens, act, device_type)


def train_bytes(model: GPTConfig, train: TrainConfig, vocab_size: int, processes: int = 1,
                mode: ParallelMode = MODES["ddp"], device_type: str = "cuda") -> int:
    """An estimate of one training process's peak memory in bytes under parallel `mode` with `processes` processes.
    It holds the matrices with their gradients and optimizer state in fp32 (the optimizer's `bytes_per_weight`: AdamW
    16, Muon 12), as the mode holds them (`ParallelMode.state_bytes`: whole, or sharded with what it gathers), and
    what one micro-batch's forward keeps for backward (`activation_bytes`, measured). The gradients (4 bytes a weight)
    exist from the first backward of a step on, so the peak is the larger of the forward's end without them and the
    backward's end with them, unless gradient accumulation holds them through the later micro steps' forwards.
    bench/bench_memory.py sets it beside measured peaks."""
    weights, block, act = matrix_params(model, vocab_size), block_params(model), act_bytes(train)
    root, per_weight = weights - model.n_layer * block, optimizer_kind(train).bytes_per_weight
    state = mode.state_bytes(weights, root, block, per_weight, processes, act)
    grads = state - mode.state_bytes(weights, root, block, per_weight - 4, processes, act)
    activations = activation_bytes(model, train, vocab_size, mode, device_type)
    if train.total_batch_tokens > train.micro_batch * model.block_size * processes:  # micro steps accumulate
        return state + activations
    return state - grads + max(grads, activations)


def _cgroup_room() -> int | None:
    """What the process's cgroup (v2) limit still allows, if any: a container's limit is not in psutil's figure."""
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
    except (OSError, ValueError):
        return None
    return None if limit == "max" else int(limit) - used


def available_bytes(device: torch.device) -> int | None:
    """Memory free on `device`: the GPU's, or the available RAM (less under a cgroup limit); None on MPS."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type == "cpu":
        room, cgroup = psutil.virtual_memory().available, _cgroup_room()
        return room if cgroup is None else min(room, cgroup)
    return None


def check_fits(model: ModelConfig, train: TrainConfig, vocab_size: int, device: torch.device, processes: int = 1,
               mode: ParallelMode = MODES["ddp"]) -> None:
    """A UserError naming the params when training a scratch `model` cannot fit in `device`'s free memory under
    `mode`, with the need under a sharded mode where that would fit and `mode` does not."""
    free = available_bytes(device) if model.init_from == "scratch" else None
    if free is None:  # a loaded model's weights are known to fit; MPS cannot tell
        return
    sharing = processes if device.type == "cpu" else 1  # CPU processes share one RAM
    need = train_bytes(model, train, vocab_size, processes, mode, device.type)
    if need * sharing <= free:
        return
    weights = matrix_params(model, vocab_size) / 1e6
    held = (f"1/{mode.shards(processes)} of {weights:,.0f}M weights with their gradients and optimizer state, the "
            f"blocks it gathers" if mode.sharded else
            f"{weights:,.0f}M weights with their gradients and optimizer state")
    has = (f"the {processes} processes on the cpu need {need * sharing / GIB:,.1f} GiB together and it has"
           if sharing > 1 else f"{device} has")
    said = (f"params.yaml model.n_layer={model.n_layer}, model.n_embd={model.n_embd}, "
            f"train.micro_batch={train.micro_batch}, model.block_size={model.block_size}: training with "
            f"train.parallel={mode.name} needs about {need / GIB:,.1f} GiB a process ({held}, and the activations "
            f"of one micro-batch); {has} {free / GIB:,.1f} GiB free")
    for other in (m for m in MODES.values() if m.sharded and not mode.sharded and processes > 1):
        sharded = train_bytes(model, train, vocab_size, processes, other, device.type)
        if sharded * sharing <= free:
            raise UserError(f"{said}. With train.parallel: {other.name} each of the {processes} processes would hold "
                            f"1/{other.shards(processes)} of the weights, gradients and optimizer state and need "
                            f"about {sharded / GIB:,.1f} GiB: set train.parallel: {other.name}")
    sharded = ", ".join(m.name for m in MODES.values() if m.sharded)
    more = f", or shard it over more GPUs (train.nproc, train.parallel: {sharded})" if sharing == 1 and processes == 1 \
        else ""
    raise UserError(f"{said}: make the model smaller or lower train.micro_batch{more}")


def _proc_status_kib(field: str) -> int | None:
    try:
        m = re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M)
    except OSError:
        return None
    return int(m.group(1)) * 1024 if m else None


def held_bytes(device: torch.device) -> int:
    """What this process holds now: CUDA, the caching allocator's reserved memory; CPU, the resident set."""
    if device.type == "cuda":
        return torch.cuda.memory_reserved(device)
    return _proc_status_kib("VmRSS") or psutil.Process().memory_info().rss


def reset_peak(device: torch.device) -> None:
    """Start a new peak at what is held now (Linux: /proc/self/clear_refs resets the resident high-water mark)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    with suppress(OSError):  # not Linux, or an old kernel: the peak since the start of the process (an upper bound)
        Path("/proc/self/clear_refs").write_text("5")


def peak_bytes(device: torch.device) -> int:
    """The most this process held since `reset_peak` (or since it started, where that cannot be reset)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_reserved(device)
    if (hwm := _proc_status_kib("VmHWM")) is not None:
        return hwm
    import resource  # Unix only: imported where /proc is missing

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def budget_bytes(device: torch.device) -> int | None:
    """What this process may hold at most: what it holds and its share of what is free (CPU processes share the RAM)."""
    free = available_bytes(device)
    if free is None:
        return None
    sharing = int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if device.type == "cpu" else 1
    return held_bytes(device) + free // sharing


def state_bytes(params: Iterable[torch.Tensor], optimizers: Iterable[torch.optim.Optimizer]) -> int:
    """Bytes this process holds of the gradients of `params` and of the optimizers' state tensors (of a sharded one,
    its shards)."""
    grads = sum(local(p.grad).nbytes for p in params if p.grad is not None)
    return grads + sum(local(v).nbytes for opt in optimizers for st in opt.state.values() for v in st.values()
                       if isinstance(v, torch.Tensor))


def micro_batches(sequences_per_step: int) -> list[int]:
    """The train.micro_batch values gradient accumulation can make a step's sequences per process of: its divisors."""
    return [b for b in range(1, sequences_per_step + 1) if sequences_per_step % b == 0]


class FirstSteps:
    """The first optimizer steps' peak against what the process may use: create it before them, `check` after (every
    rank: the worst one decides)."""

    def __init__(self, device: torch.device, model: torch.nn.Module, optimizers: Iterable[torch.optim.Optimizer]):
        self.device, self.model, self.optimizers = device, model, list(optimizers)
        reset_peak(device)
        self.base = held_bytes(device)
        self.state0 = state_bytes(model.parameters(), self.optimizers)  # a resumed run's optimizer state
        self.budget = budget_bytes(device)

    def check(self, micro_batch: int, sequences_per_step: int, total_batch_tokens: int) -> None:
        """A StepMemory naming the largest train.micro_batch that fits when the steps peaked over FILL of the budget:
        what was held before them and the state they added are fixed, the rest proportional to micro_batch."""
        peak = peak_bytes(self.device)
        fixed = self.base + state_bytes(self.model.parameters(), self.optimizers) - self.state0
        mine = (peak, fixed, self.budget if self.budget is not None else -1)
        peak, fixed, budget = max(all_gather_objects(mine), key=lambda r: r[0] / r[2] if r[2] > 0 else 0)
        if budget < 0 or peak <= FILL * budget:
            return
        per_sequence = max(peak - fixed, 1) / micro_batch
        fits = [b for b in micro_batches(sequences_per_step)
                if b < micro_batch and fixed + b * per_sequence <= FILL * budget]
        said = (f"train.micro_batch={micro_batch}: the first training steps peaked at {peak / GIB:,.2f} GiB of the "
                f"{budget / GIB:,.2f} GiB this process may use on {self.device} (at most {FILL:.0%} is kept for a "
                f"step)")
        if not fits:
            raise StepMemory(f"{said}, and even train.micro_batch=1 would need about "
                             f"{(fixed + per_sequence) / GIB:,.2f} GiB: make the model smaller; stopped without saving")
        raise StepMemory(f"{said}: set train.micro_batch={fits[-1]} (gradient accumulation keeps "
                         f"train.total_batch_tokens={total_batch_tokens:,}); stopped without saving")


@contextmanager
def out_of_memory_named(micro_batch: int, sequences_per_step: int, device: torch.device) -> Iterator[None]:
    """An out-of-memory error in a training step as one line naming train.micro_batch and a value to try."""
    try:
        yield
    except (torch.OutOfMemoryError, RuntimeError) as e:
        if not isinstance(e, torch.OutOfMemoryError) and CPU_OUT_OF_MEMORY not in str(e):
            raise
        smaller = [b for b in micro_batches(sequences_per_step) if b <= micro_batch // 2]
        todo = (f"try train.micro_batch={smaller[-1]} (gradient accumulation keeps train.total_batch_tokens)"
                if smaller else "make the model smaller")
        raise StepMemory(f"train.micro_batch={micro_batch}: a training step ran out of {device} memory; {todo}; "
                         f"stopped without saving (checkpoints already written are kept)") from e
