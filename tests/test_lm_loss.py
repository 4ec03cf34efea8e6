"""The chunked LM-head cross-entropy (lm_loss) against the plain F.cross_entropy(lm_head(h)): loss and gradients."""
import pytest
import torch
import torch.nn.functional as F

from gptcore.model import lm_loss as L
from gptcore.model.gpt import GPT, GPTConfig
from gptcore.model.lm_loss import lm_loss


def plain_loss(model: GPT, idx: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """The obvious computation, written here: every logit materialised, soft-cap by its formula, \
then F.cross_entropy."""
    logits = model.lm_head(model.hidden_states(idx))
    cap = model.config.logit_softcap
    if cap is not None:
        logits = cap * torch.tanh(logits / cap)
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-1, reduction=reduction)


def grads(model: GPT, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("softcap", [None, 5.0], ids=["no-cap", "softcap"])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_loss_and_gradients_equal_the_plain_computation(tie, softcap, reduction, monkeypatch):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=300, tie_embeddings=tie,
                          logit_softcap=softcap))
    idx = torch.randint(0, 300, (3, 32))
    targets = torch.randint(0, 300, (3, 32))
    targets[0, :5] = -1  # ignored positions (padding)
    targets[2, -3:] = -1
    # 96 rows in chunks of 40: several chunks and a short last one
    monkeypatch.setitem(L.LOSS_CHUNK_ELEMENTS, "cpu", 40 * 300)
    _, chunked = model(idx, targets, reduction=reduction)
    expected = plain_loss(model, idx, targets, reduction)
    torch.testing.assert_close(chunked, expected, rtol=1e-5, atol=1e-5)
    got, want = grads(model, chunked), grads(model, expected)
    assert got.keys() == want.keys() and "transformer.wte.weight" in got
    assert tie or "lm_head.weight" in got  # tied, named_parameters lists the one matrix once
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-6, msg=name)


def test_chunk_size_does_not_change_the_result():
    torch.manual_seed(1)
    h = torch.randn(50, 16, requires_grad=True)
    w = torch.randn(40, 16, requires_grad=True)
    y = torch.randint(0, 40, (50,))
    out = []
    for rows in (1, 13, 50, 1000):
        h.grad = w.grad = None
        loss = lm_loss(h, w, y, chunk_rows=rows)
        loss.backward()
        out.append((loss.detach(), h.grad.clone(), w.grad.clone()))
    for other in out[1:]:
        for a, b in zip(out[0], other):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_no_grad_and_all_ignored():
    h, w = torch.randn(6, 8), torch.randn(10, 8)
    y = torch.tensor([1, 2, -1, 3, -1, 9])
    with torch.no_grad():
        loss = lm_loss(h, w, y, chunk_rows=4)
    torch.testing.assert_close(loss, F.cross_entropy(h @ w.t(), y, ignore_index=-1))
    assert torch.isnan(lm_loss(h, w, torch.full((6,), -1)))  # as F.cross_entropy: 0 / 0
    assert lm_loss(h, w, torch.full((6,), -1), reduction="sum").item() == 0.0


def test_bf16_autocast_close_to_the_plain_path():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=200))
    idx, targets = torch.randint(0, 200, (2, 16)), torch.randint(0, 200, (2, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, chunked = model(idx, targets)
        expected = plain_loss(model, idx, targets)
    assert chunked.dtype == torch.float32
    torch.testing.assert_close(chunked, expected, rtol=2e-3, atol=2e-3)
    got, want = grads(model, chunked), grads(model, expected)
    for name in want:  # bf16 matmuls: about 3 significant digits
        torch.testing.assert_close(got[name], want[name], rtol=0.05, atol=2e-3, msg=name)


def test_without_grad_mode_only_the_loss_is_computed():
    """Under no_grad (val loss, evaluation) the head's one matmul, counted by torch's FLOP counter: 2 N V C, not the
    4 to 6 N V C of the loss and its gradients (which the Function cannot tell apart by itself: inside it, autograd
    still marks the weight as needing a gradient)."""
    from torch.utils.flop_counter import FlopCounterMode

    n, c, v = 24, 16, 50
    h = torch.randn(n, c, requires_grad=True)
    w = torch.randn(v, c, requires_grad=True)
    y = torch.randint(0, v, (n,))
    with torch.no_grad(), FlopCounterMode(display=False) as counted:
        loss = lm_loss(h, w, y, chunk_rows=8)
    assert counted.get_total_flops() == 2 * n * v * c
    assert torch.allclose(loss, F.cross_entropy(h @ w.t(), y), atol=1e-6)
    with FlopCounterMode(display=False) as counted:
        lm_loss(h, w, y, chunk_rows=8).backward()
    # the gradients' matmuls too (an in-place addmm_ may go uncounted)
    assert counted.get_total_flops() >= 4 * n * v * c


# -----------------------------------------------------------------------------
# the chunk size, and the switch to the plain path (GPTCORE_LOSS_CHUNK_ELEMENTS)

def test_chunk_rows_follow_the_switch(monkeypatch):
    monkeypatch.delenv(L.CHUNK_SWITCH, raising=False)
    assert L.loss_chunk_rows("cpu", 50304, 128) == 166  # 2^23 logits: the built-in CPU budget
    assert L.loss_chunk_rows("cuda", 50304, 128) == 1334  # 2^26 on a GPU
    assert L.loss_chunk_rows("cpu", 50304, 256) == 256  # never fewer rows than n_embd
    assert L.loss_chunk_rows("cpu", 50304, 768) == 768  # chunked at every width: never slower in a median measured
    assert L.loss_chunk_rows("mps", 50304, 768) == 768 and L.loss_chunk_rows("cuda", 50304, 768) == 1334
    monkeypatch.setenv(L.CHUNK_SWITCH, "0")
    assert L.loss_chunk_rows("cpu", 50304, 768) == 0 and L.loss_chunk_rows("cuda", 50304, 768) == 0
    monkeypatch.setenv(L.CHUNK_SWITCH, str(1000 * 50304))
    assert L.loss_chunk_rows("cpu", 50304, 768) == 1000


@pytest.mark.parametrize("value", ["-1", "lots", "1e6", "", "²", "٣"])  # superscript two, Arabic-Indic three
def test_a_bad_switch_is_one_line_naming_it(value, monkeypatch):
    from gptcore.errors import UserError

    monkeypatch.setenv(L.CHUNK_SWITCH, value)
    with pytest.raises(UserError) as e:
        lm_loss(torch.randn(4, 8), torch.randn(10, 8), torch.zeros(4, dtype=torch.long))
    assert "\n" not in str(e.value) and L.CHUNK_SWITCH in str(e.value) and repr(value) in str(e.value)


@pytest.mark.parametrize("softcap", [None, 5.0], ids=["no-cap", "softcap"])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_switched_off_the_model_takes_the_plain_path(softcap, reduction, monkeypatch):
    """GPTCORE_LOSS_CHUNK_ELEMENTS=0: the model's loss is F.cross_entropy over every logit (not the chunked Function),
    with the chunked path's results within float rounding."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=300, logit_softcap=softcap))
    idx, targets = torch.randint(0, 300, (3, 16)), torch.randint(0, 300, (3, 16))
    targets[1, :4] = -1
    monkeypatch.setenv(L.CHUNK_SWITCH, "0")
    _, plain = model(idx, targets, reduction=reduction)
    assert "ChunkedLMLoss" not in type(plain.grad_fn).__name__
    torch.testing.assert_close(plain, plain_loss(model, idx, targets, reduction), rtol=1e-6, atol=1e-6)
    monkeypatch.setenv(L.CHUNK_SWITCH, str(10 * 300))  # 32 rows a chunk (n_embd's floor): two chunks
    _, chunked = model(idx, targets, reduction=reduction)
    assert "ChunkedLMLoss" in type(chunked.grad_fn).__name__
    torch.testing.assert_close(chunked, plain, rtol=1e-5, atol=1e-5)
    got, want = grads(model, chunked), grads(model, plain)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-6, msg=name)
