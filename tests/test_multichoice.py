"""The one scorer: hand-computed losses, truncation, packed == one forward per example (tests/reference_scorer.py),
normalisation over the tokenizer's vocabulary (as the Hugging Face export under transformers), DDP counts."""
import json
import math
import random
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from reference_scorer import render_rows, score_examples_reference

from gptcore.errors import UserError
from gptcore.eval.scorer import ChoiceResult, Example, fit_example, score_examples, write_predictions
from gptcore.model.gpt import GPT, GPTConfig

# Next-token distributions of a bigram "model": P[a][b] = p(next = b | current = a).
P = [[0.1, 0.2, 0.3, 0.4],
     [0.25, 0.25, 0.25, 0.25],
     [0.7, 0.1, 0.1, 0.1],
     [0.05, 0.05, 0.1, 0.8]]


class BigramLM(nn.Module):
    """Logits at position t are log P[idx[t]], so every loss is -log of an entry of P, by hand.
    Has the model interface but not nanoGPT's module layout; positions and the mask cannot change a bigram's
    scores, so the packed layout must give exactly the hand-computed losses."""

    def __init__(self, probs: list[list[float]], block_size: int):
        super().__init__()
        V = len(probs)
        self.config = SimpleNamespace(block_size=block_size, vocab_size=V)
        self.lm_head = nn.Linear(V, V, bias=False)
        with torch.no_grad():
            self.lm_head.weight.copy_(torch.tensor(probs).log().T)

    def hidden_states(self, idx, pos=None, attn_mask=None):
        return F.one_hot(idx, self.config.vocab_size).float()

    def logits(self, hidden):
        return self.lm_head(hidden)

    def forward(self, idx, targets=None):
        return self.logits(self.hidden_states(idx)), None


def nll(prev: int, tokens: list[int]) -> list[float]:
    out = []
    for t in tokens:
        out.append(-math.log(P[prev][t]))
        prev = t
    return out


def tiny_gpt(seed: int = 0, block_size: int = 64, vocab: int = 128) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(block_size=block_size, vocab_size=vocab, n_layer=2, n_head=2, n_embd=32)).eval()


def random_examples(n: int, seed: int = 0, vocab: int = 128, max_context: int = 80) -> list[Example]:
    rng = random.Random(seed)
    return [Example(context=[rng.randrange(vocab) for _ in range(rng.randint(1, max_context))],
                    endings=[[rng.randrange(vocab) for _ in range(rng.randint(1, 20))] for _ in range(4)],
                    label=rng.randrange(4), index=1000 + i) for i in range(n)]


def assert_same(ref: ChoiceResult, fast: ChoiceResult, tol: float = 1e-5) -> None:
    assert (fast.count, fast.correct, fast.correct_norm) == (ref.count, ref.correct, ref.correct_norm)
    assert len(fast.predictions) == len(ref.predictions)
    for p, q in zip(ref.predictions, fast.predictions):
        keys = ("index", "label", "pred", "pred_norm")
        assert [q[k] for k in keys] == [p[k] for k in keys]
        for key in ("sum_losses", "mean_losses"):
            assert q[key] == pytest.approx(p[key], rel=tol, abs=tol), (p["index"], key)


def test_row_picker_matches_hand_computed_losses():
    # context ends in token 0; sums pick ending 0, means pick ending 1 (longer but likelier per token)
    ex = Example(context=[1, 0], endings=[[3], [3, 3, 3], [2, 0], [1]], label=1, index=7)
    sums = [sum(nll(0, e)) for e in ex.endings]
    means = [s / len(e) for s, e in zip(sums, ex.endings)]
    assert sums[0] == pytest.approx(-math.log(0.4))
    assert means[1] == pytest.approx(-(math.log(0.4) + 2 * math.log(0.8)) / 3)
    model = BigramLM(P, block_size=16)
    for result in (score_examples_reference(model, [ex], 4),
                   score_examples(model, [ex], 4, device="cpu", progress=False)):
        (pred,) = result.predictions
        assert pred["sum_losses"] == pytest.approx(sums, rel=1e-6)
        assert pred["mean_losses"] == pytest.approx(means, rel=1e-6)
        assert (pred["index"], pred["pred"], pred["pred_norm"]) == (7, 0, 1)
        assert (result.count, result.correct, result.correct_norm) == (1, 0, 1)
        assert (result.acc, result.acc_norm) == (0.0, 1.0)


def test_truncation_cuts_context_from_the_left_and_keeps_endings_whole():
    ex = Example(context=[0, 1, 2, 3, 0, 1, 3, 2], endings=[[0, 0, 1], [1], [3, 3], [2, 1]], label=0)
    context, endings = fit_example(ex, block_size=5)
    assert context == [3, 2] and endings == ex.endings  # 5 - longest ending (3) = 2 context tokens
    tokens, mask = render_rows(ex, block_size=5)
    assert tokens.shape == (4, 5)
    assert mask.sum(dim=1).tolist() == [3, 1, 2, 2]
    assert tokens[1, :3].tolist() == [3, 2, 1] and mask[1].tolist() == [0, 0, 1, 0, 0]
    # the model sees only the kept context: every ending is scored after token 2
    model = BigramLM(P, block_size=5)
    want = [sum(nll(2, e)) for e in ex.endings]
    for result in (score_examples_reference(model, [ex], 4),
                   score_examples(model, [ex], 4, device="cpu", progress=False)):
        assert result.predictions[0]["sum_losses"] == pytest.approx(want, rel=1e-6)


def test_bad_examples_are_rejected_with_their_index():
    with pytest.raises(UserError, match="example 3: an ending of 8 tokens does not fit block_size 8"):
        fit_example(Example([1], [[0] * 8, [1]], label=0, index=3), block_size=8)
    with pytest.raises(UserError, match="example 4: label 5"):
        fit_example(Example([1], [[0], [1]], label=5, index=4), block_size=8)
    with pytest.raises(UserError, match="example 5: empty context"):
        fit_example(Example([], [[0], [1]], label=0, index=5), block_size=8)
    with pytest.raises(ValueError, match="world_size=2 but torch.distributed is not initialised"):
        score_examples(BigramLM(P, 8), [], 4, device="cpu", rank=0, world_size=2)


@pytest.fixture(scope="module")
def reference_200():
    examples = random_examples(200)  # contexts up to 80 tokens: many are cut to the 64-token block
    return examples, score_examples_reference(tiny_gpt(), examples, 128)


@pytest.mark.filterwarnings("error")
def test_fast_path_equals_one_forward_per_example_fp32(reference_200):
    examples, ref = reference_200
    model = tiny_gpt().train()  # as inside a training loop: scoring runs in eval mode and restores the mode
    fast = score_examples(model, examples, 128, device="cpu", batch_size=16, progress=False)
    assert model.training
    assert_same(ref, fast)
    assert ref.count == 200 and fast.examples_per_sec > 0


def test_bfloat16_autocast_stays_close_to_fp32():
    model = tiny_gpt()
    examples = random_examples(30, seed=1)
    fp32 = score_examples(model, examples, 128, device="cpu", progress=False)
    bf16 = score_examples(model, examples, 128, device="cpu", dtype=torch.bfloat16, progress=False)
    for p, q in zip(fp32.predictions, bf16.predictions):
        assert q["mean_losses"] == pytest.approx(p["mean_losses"], rel=2e-2)


def _ddp_worker(rank: int, world_size: int, init_file: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        result = score_examples(tiny_gpt(), random_examples(41, seed=2), 128, device="cpu", batch_size=8,
                                progress=False)
        if rank == 0:
            with open(out, "w") as f:
                json.dump({"counts": [result.count, result.correct, result.correct_norm],
                           "predictions": result.predictions}, f)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_gloo_ranks_give_the_same_counts_and_predictions_as_one(tmp_path):
    single = score_examples(tiny_gpt(), random_examples(41, seed=2), 128, device="cpu", batch_size=8, progress=False)
    out = tmp_path / "rank0.json"
    mp.spawn(_ddp_worker, args=(2, str(tmp_path / "store"), str(out)), nprocs=2, join=True)
    got = json.loads(out.read_text())
    assert got["counts"] == [single.count, single.correct, single.correct_norm] and single.count == 41
    assert [p["index"] for p in got["predictions"]] == [p["index"] for p in single.predictions]
    for p, q in zip(single.predictions, got["predictions"]):
        assert (q["pred"], q["pred_norm"]) == (p["pred"], p["pred_norm"])
        assert q["mean_losses"] == pytest.approx(p["mean_losses"], rel=1e-5)


def test_write_predictions_is_jsonl_and_atomic(tmp_path):
    ex = Example(context=[1, 0], endings=[[3], [3, 3, 3], [2, 0], [1]], label=1, index=7)
    result = score_examples(BigramLM(P, 16), [ex, Example([2], [[0], [1]], label=0, index=8)], 4,
                            device="cpu", progress=False)
    path = write_predictions(tmp_path / "metrics" / "hellaswag_predictions.jsonl", {"hellaswag": result})
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows == [{"task": "hellaswag", **p} for p in result.predictions] and [r["index"] for r in rows] == [7, 8]
    assert set(rows[0]) == {"task", "index", "label", "pred", "pred_norm", "sum_losses", "mean_losses"}
    assert sorted(p.name for p in path.parent.iterdir()) == ["hellaswag_predictions.jsonl"]  # no temp left
    assert (result.count, result.acc, result.acc_norm) == (2, 0.5, 1.0)


def test_scores_are_normalised_over_the_tokenizers_vocabulary_not_the_padded_head():
    model = tiny_gpt(vocab=192)  # a head 64 ids wider than the tokenizer's 128
    with torch.no_grad():
        model.lm_head.weight[128:] *= 100  # padding ids the model finds likely: they must take no probability
    examples = random_examples(20, seed=3)
    ours = score_examples(model, examples, 128, device="cpu", batch_size=8, progress=False)
    assert_same(score_examples_reference(model, examples, 128), ours)
    padded = score_examples_reference(model, examples, 192)
    assert all(q > p + 1.0 for a, b in zip(ours.predictions, padded.predictions)
               for p, q in zip(a["sum_losses"], b["sum_losses"]))
    with pytest.raises(ValueError, match="vocab_size=193: must be in 1..192"):
        score_examples(model, examples, 193, device="cpu", progress=False)


def test_log_likelihoods_equal_the_hugging_face_exports_under_transformers(tmp_path):
    """The export keeps the tokenizer's 50,257 rows of a 50,304-wide head: gptcore scores as transformers does on it."""
    transformers = pytest.importorskip("transformers")
    from gptcore.model.hf import save_hf_gpt2

    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=64, vocab_size=50304, n_layer=2, n_head=2, n_embd=32)).eval()
    save_hf_gpt2(model, tmp_path, vocab_size=50257)
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    assert hf.config.vocab_size == 50257
    examples = random_examples(12, seed=4, vocab=50257)
    got = [loss for p in score_examples(model, examples, 50257, device="cpu", batch_size=4, progress=False).predictions
           for loss in p["sum_losses"]]
    pairs = [(context, ending) for context, endings in (fit_example(ex, 64) for ex in examples) for ending in endings]
    T = max(len(c) + len(e) - 1 for c, e in pairs)  # right padding: causal attention keeps it out of the scores
    with torch.no_grad():
        logits = hf(torch.tensor([c + e[:-1] + [0] * (T - len(c) - len(e) + 1) for c, e in pairs])).logits
    # in float64, the ending's rows only (the whole batch's logits in float64 would be over a gigabyte)
    want = [-logits[i, len(c) - 1:len(c) + len(e) - 1].double().log_softmax(-1).gather(1, torch.tensor(e)[:, None])
            .sum().item() for i, (c, e) in enumerate(pairs)]
    assert got == pytest.approx(want, abs=1e-4)
