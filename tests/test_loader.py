import os

import numpy as np
import pytest
import torch

from gptcore.data.loader import TokenLoader
from gptcore.errors import UserError


@pytest.fixture
def shard_dir(tmp_path):
    # Three shards of distinct, recognisable tokens (each token is its global position, mod 60000).
    sizes = [1000, 700, 1300]
    start = 0
    for i, n in enumerate(sizes):
        np.save(tmp_path / f"train_{i:06d}.npy", (np.arange(start, start + n) % 60000).astype(np.uint16))
        start += n
    return tmp_path


def paths(d):
    return sorted(d.glob("train_*.npy"))


def collect(loader, steps):
    out = []
    for _ in range(steps):
        out.append([loader.next_batch() for _ in range(loader.grad_accum)])
    return out


def test_targets_are_inputs_shifted(shard_dir):
    ld = TokenLoader(paths(shard_dir), micro_batch=2, block_size=8, step_tokens=32)
    x, y = ld.next_batch()
    assert x.dtype == torch.int64 and x.shape == (2, 8)
    assert torch.equal(x.flatten()[1:], y.flatten()[:-1])


def test_two_ranks_see_what_one_rank_sees_with_accumulation(shard_dir):
    one = TokenLoader(paths(shard_dir), 2, 8, 32, rank=0, world_size=1)
    r0 = TokenLoader(paths(shard_dir), 2, 8, 32, rank=0, world_size=2)
    r1 = TokenLoader(paths(shard_dir), 2, 8, 32, rank=1, world_size=2)
    assert one.grad_accum == 2 and r0.grad_accum == 1
    for _ in range(40):  # crosses shard and epoch boundaries
        a, b = one.next_batch(), one.next_batch()
        c, d = r0.next_batch(), r1.next_batch()
        assert torch.equal(a[0], c[0]) and torch.equal(b[0], d[0])
        assert not torch.equal(c[0], d[0])  # ranks are disjoint


def test_each_token_once_per_epoch_and_tails_skipped(shard_dir):
    ld = TokenLoader(paths(shard_dir), 2, 8, 32, shuffle=True, seed=3)
    windows = (999 // 32) + (699 // 32) + (1299 // 32)  # optimizer steps in one pass: each shard's whole windows
    seen = []
    for _ in range(windows):
        for _ in range(ld.grad_accum):
            seen.append(ld.next_batch()[0].flatten())
    seen = torch.cat(seen)
    assert len(seen) == len(set(seen.tolist()))  # no window twice in the epoch
    assert ld.state.epoch == 1


def test_shuffle_is_seeded_and_differs_per_epoch(shard_dir):
    a = collect(TokenLoader(paths(shard_dir), 2, 8, 32, shuffle=True, seed=1), 5)
    b = collect(TokenLoader(paths(shard_dir), 2, 8, 32, shuffle=True, seed=1), 5)
    c = collect(TokenLoader(paths(shard_dir), 2, 8, 32, shuffle=True, seed=2), 5)
    plain = collect(TokenLoader(paths(shard_dir), 2, 8, 32), 5)
    assert all(torch.equal(p[0], q[0]) for s, t in zip(a, b) for p, q in zip(s, t))
    assert not all(torch.equal(p[0], q[0]) for s, t in zip(a, c) for p, q in zip(s, t))
    assert not all(torch.equal(p[0], q[0]) for s, t in zip(a, plain) for p, q in zip(s, t))


def test_state_dict_resumes_exactly(shard_dir):
    ld = TokenLoader(paths(shard_dir), 2, 8, 32, shuffle=True, seed=7)
    collect(ld, 37)
    state = ld.state_dict()
    expected = collect(ld, 30)
    fresh = TokenLoader(paths(shard_dir), 2, 8, 32, shuffle=True, seed=7)
    fresh.load_state_dict(state)
    got = collect(fresh, 30)
    assert all(torch.equal(p[0], q[0]) for s, t in zip(expected, got) for p, q in zip(s, t))


def test_a_position_is_never_carried_into_other_shards(shard_dir):
    """A position (shard 1, window 5) means other tokens in other shards: refused, never silently resumed."""
    ld = TokenLoader(paths(shard_dir), 2, 8, 32, shuffle=True, seed=7)
    collect(ld, 37)
    state = ld.state_dict()
    np.save(shard_dir / "train_000003.npy", np.zeros(500, dtype=np.uint16))  # the data changed: one more shard
    with pytest.raises(ValueError, match="loader state is for other shards"):
        TokenLoader(paths(shard_dir), 2, 8, 32, shuffle=True, seed=7).load_state_dict(state)


def test_indivisible_batch_is_an_assertion(shard_dir):
    # train.loop.check_run refuses it with one line (tests/test_params.py); reaching the loader is a bug
    with pytest.raises(AssertionError):
        TokenLoader(paths(shard_dir), 2, 8, 100)


def test_shards_smaller_than_a_step_are_a_clear_error(shard_dir):
    with pytest.raises(UserError, match="no training shard holds one step"):
        TokenLoader(paths(shard_dir), 2, 8, 2048)


def resident_bytes() -> int:
    """This process's resident set size now (Linux /proc), not its high-water mark."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads the resident set size from Linux /proc")
def test_a_batch_reads_its_window_not_the_shard(tmp_path):
    n = 96 * 2**20  # a 192 MB shard, written through a memory map so the test itself never holds it
    shard = np.lib.format.open_memmap(tmp_path / "train_000000.npy", mode="w+", dtype=np.uint16, shape=(n,))
    shard[:] = 7
    shard.flush()
    del shard
    before = resident_bytes()
    ld = TokenLoader([tmp_path / "train_000000.npy"], 4, 64, 256)
    x, _ = ld.next_batch()
    ld.next_batch()
    assert int(x[0, 0]) == 7
    assert resident_bytes() - before < 32 * 2**20  # loading the shard would add 192 MB
