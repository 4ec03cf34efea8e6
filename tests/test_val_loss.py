"""Val loss scores exactly val_tokens targets (build-nanogpt's count), whatever the block and batch sizes."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from gptcore.data.shard_set import ShardSet
from gptcore.errors import UserError
from gptcore.eval.val_loss import val_loss, val_stream
from gptcore.model.gpt import GPT, GPTConfig

CPU = torch.device("cpu")


class OnlyZeroIsCheap(torch.nn.Module):
    """Predicts token 0 with certainty: a target 0 costs ~0, any other target costs `cost`."""

    def __init__(self, vocab: int = 4, cost: float = 30.0) -> None:
        super().__init__()
        self.vocab, self.cost = vocab, cost

    def forward(self, x, targets=None, reduction="mean"):
        logits = torch.zeros(*x.shape, self.vocab)
        logits[..., 0] = self.cost  # target 0 costs log(1 + 3e-30) = 0 in fp32
        if targets is None:
            return logits, None
        return None, F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction=reduction)


@pytest.mark.parametrize("block_size,batch_size", [(8, 1), (8, 3), (5, 2), (64, 4)])
def test_the_last_of_val_tokens_targets_is_scored(block_size, batch_size):
    n = 40
    tokens = np.zeros(n + 1, dtype=np.uint16)
    tokens[-1] = 1  # only the n-th target is expensive: a loop scoring n - 1 targets would report ~0
    model = OnlyZeroIsCheap()
    per_target = F.cross_entropy(model(torch.zeros(1, 1, dtype=torch.long))[0][0], torch.tensor([1])).item()
    assert val_loss(model, tokens, block_size, batch_size, CPU) == pytest.approx(per_target / n, rel=1e-5)


def test_matches_a_plain_window_by_window_reference():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=50)).eval()
    tokens = np.random.default_rng(0).integers(0, 50, 101).astype(np.uint16)  # 100 targets: 6 windows of 16 + 4
    losses = []
    with torch.no_grad():
        for s in range(0, 100, 16):
            chunk = torch.from_numpy(tokens[s : min(s + 16, 100) + 1].astype(np.int64))[None]
            logits, _ = model(chunk[:, :-1])
            losses.append(F.cross_entropy(logits[0], chunk[0, 1:], reduction="none"))
    expected = torch.cat(losses)
    assert expected.numel() == 100
    assert val_loss(model, tokens, 16, 4, CPU) == pytest.approx(expected.mean().item(), rel=1e-5)


def write_split(d, val, train):
    np.save(d / "val_000000.npy", np.asarray(val, dtype=np.uint16))
    np.save(d / "train_000000.npy", np.asarray(train, dtype=np.uint16))


def test_val_stream_reads_one_token_past_val_tokens(tmp_path):
    write_split(tmp_path, [1, 2, 3, 4], [5, 6, 7])  # build-nanogpt's layout: GPT-2 ids, no manifest
    data = ShardSet.open(tmp_path)
    assert val_stream(data, 3).tolist() == [1, 2, 3, 4]
    # a val split of exactly val_tokens: the last target is the next token of the corpus, train's first
    assert val_stream(data, 4).tolist() == [1, 2, 3, 4, 5]
    with pytest.raises(UserError, match="the val split has 4 tokens, fewer than val_tokens=5"):
        val_stream(data, 5)
