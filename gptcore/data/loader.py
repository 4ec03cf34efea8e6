"""The training loader: rank-disjoint, resumable, optionally shuffled batches from memory-mapped shards."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from gptcore.data.shards import check_token_range, load_tokens
from gptcore.errors import UserError

if TYPE_CHECKING:
    import torch


@dataclass
class LoaderState:
    """Where the loader is: epoch, shard in the epoch's order, window in the shard's, micro batch in the window."""

    epoch: int = 0
    shard: int = 0  # position in this epoch's shard order
    window: int = 0  # position in this shard's window order
    micro: int = 0  # micro batch index within the window (0 at step boundaries)


class TokenLoader:
    """Training batches (x, y) of micro_batch x block_size tokens from memory-mapped shards; rank-disjoint, resumable.

    A step reads one window of `step_tokens` (train.total_batch_tokens) contiguous tokens, plus one for the targets,
    cut into micro batches of B*T: micro batch k goes to rank k % world_size at accumulation step k // world_size, so a
    step sees the same tokens however the batch is split over ranks and accumulation steps. Windows never straddle
    shards (a shard's tail short of a window is skipped); `shuffle` permutes shards and windows each epoch, seeded by
    (seed, epoch), so the whole loader state is four integers."""

    def __init__(self, paths: Sequence[Path], micro_batch: int, block_size: int, step_tokens: int, rank: int = 0,
                 world_size: int = 1, shuffle: bool = False, seed: int = 0, vocab_size: int | None = None) -> None:
        if not paths:
            raise ValueError("no training shards given to the loader")
        self.paths = [Path(p) for p in paths]
        self.B, self.T = micro_batch, block_size
        self.step_tokens = step_tokens
        self.rank, self.world_size = rank, world_size
        per_step = micro_batch * block_size * world_size
        assert step_tokens % per_step == 0, (step_tokens, per_step)  # check_run refused it: here, a bug
        self.grad_accum = step_tokens // per_step
        self.shuffle, self.seed = shuffle, seed
        self.vocab_size = vocab_size  # ids at or above it are reported with shard and offset, not left to crash
        # windows per shard from the header alone: the mmap costs no memory until a window is read
        self._windows = [(len(load_tokens(p)) - 1) // step_tokens for p in self.paths]
        if not any(self._windows):
            raise UserError(f"no training shard holds one step of train.total_batch_tokens={step_tokens} (+1) tokens; "
                            f"largest has {max(len(load_tokens(p)) for p in self.paths)} tokens: lower "
                            f"total_batch_tokens or add data")
        self.state = LoaderState()
        self._open: tuple[int, np.ndarray] | None = None

    def _shard_order(self, epoch: int) -> list[int]:
        order = [i for i, n in enumerate(self._windows) if n > 0]
        if self.shuffle:
            order = [order[i] for i in np.random.default_rng([self.seed, epoch]).permutation(len(order))]
        return order

    def _window_order(self, epoch: int, shard_index: int) -> np.ndarray:
        n = self._windows[shard_index]
        return np.random.default_rng([self.seed, epoch, shard_index]).permutation(n) if self.shuffle else np.arange(n)

    def _tokens(self, shard_index: int) -> np.ndarray:
        if self._open is None or self._open[0] != shard_index:
            self._open = (shard_index, load_tokens(self.paths[shard_index]))
        return self._open[1]

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's next (inputs, targets), each int64 [B, T] on the CPU."""
        import torch  # here, not at the top: the tokenize stage and its workers import this module too

        s = self.state
        shard_index = self._shard_order(s.epoch)[s.shard]
        window = int(self._window_order(s.epoch, shard_index)[s.window])
        k = s.micro * self.world_size + self.rank
        start = window * self.step_tokens + k * self.B * self.T
        buf = np.asarray(self._tokens(shard_index)[start : start + self.B * self.T + 1], dtype=np.int64)
        if self.vocab_size is not None:
            check_token_range(buf, self.vocab_size, self.paths[shard_index], start)
        x = torch.from_numpy(buf[:-1]).view(self.B, self.T)
        y = torch.from_numpy(buf[1:]).view(self.B, self.T)
        self._advance()
        return x, y

    def _advance(self) -> None:
        s = self.state
        s.micro += 1
        if s.micro < self.grad_accum:
            return
        s.micro, s.window = 0, s.window + 1
        if s.window < self._windows[self._shard_order(s.epoch)[s.shard]]:
            return
        s.window, s.shard = 0, s.shard + 1
        if s.shard == len(self._shard_order(s.epoch)):
            s.shard, s.epoch = 0, s.epoch + 1

    def _shards(self) -> list[list]:
        return [[p.name, n] for p, n in zip(self.paths, self._windows)]

    def state_dict(self) -> dict:
        """The position to resume from, with the settings and the shards (names, windows) it is only valid for."""
        return {**asdict(self.state), "seed": self.seed, "shuffle": self.shuffle, "step_tokens": self.step_tokens,
                "shards": self._shards()}

    def load_state_dict(self, d: dict) -> None:
        """Resume at a position saved by state_dict, for the same tokens per step and the same shards only."""
        if d.get("step_tokens", self.step_tokens) != self.step_tokens:
            raise ValueError(f"loader state is for {d['step_tokens']} tokens per step, "
                             f"this run uses {self.step_tokens}")
        if "shards" in d and [list(s) for s in d["shards"]] != self._shards():
            raise ValueError(f"loader state is for other shards ({len(d['shards'])} listed) than this run reads "
                             f"({len(self.paths)} in {self.paths[0].parent}): it cannot resume there")
        self.state = LoaderState(epoch=d["epoch"], shard=d["shard"], window=d["window"], micro=d["micro"])
