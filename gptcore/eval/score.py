"""How a model is scored on text: summed next-token log-probabilities, over a split's first `val_tokens` targets
(`val_loss`) or over the continuations of a context (`score_rows`, the one scorer that HellaSwag, cloze and lm-eval's
loglikelihood requests all go through, over the tokenizer's ids), with the multiple-choice picks built on it and
HellaSwag's rows (download, checks, rendering)."""
from __future__ import annotations

import hashlib
import json
import math
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from tqdm import tqdm

from gptcore import distributed
from gptcore.atomic import atomic_write, file_sha256, write_text
from gptcore.data import shards
from gptcore.data.tokenizers import Tokenizer
from gptcore.distributed import autocast_context
from gptcore.model.gpt import without_padding
from gptcore.process import UserError

# --- the held-out loss -------------------------------------------------------------------------------------------


def first_tokens(paths: Sequence[Path], n: int, vocab_size: int | None = None) -> np.ndarray:
    """The first n tokens across these shards (a view when one holds them), ids checked against `vocab_size`."""
    parts, need = [], n
    for p in paths:
        parts.append(shards.load_tokens(p)[:need])
        if vocab_size is not None:
            shards.check_token_range(parts[-1], vocab_size, p)
        need -= len(parts[-1])
        if need <= 0:
            break
    if need > 0:
        raise ValueError(f"the shards hold {n - need} tokens, fewer than the {n} asked for")
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def val_stream(shard_dir: Path, val_tokens: int, vocab_size: int | None = None) -> np.ndarray:
    """The `val_tokens + 1` tokens val_loss scores: the val split, then, when it holds exactly val_tokens, the train
    split's first token (which the loader only uses as an input); ids are checked against `vocab_size`."""
    val = shards.open_split(shard_dir, "val")
    have = sum(len(shards.load_tokens(p)) for p in val)
    if have < val_tokens:
        raise UserError(f"{shard_dir}: the val split has {have:,} tokens, fewer than val_tokens={val_tokens:,} "
                        f"(eval.val_tokens / train.val_tokens)")
    return first_tokens(val + shards.open_split(shard_dir, "train"), val_tokens + 1, vocab_size)


@torch.no_grad()
def val_loss(model: torch.nn.Module, tokens: np.ndarray, block_size: int, batch_size: int, device: torch.device,
             dtype: torch.dtype | None = None, rank: int = 0, world_size: int = 1, progress: bool = False) -> float:
    """Mean next-token cross-entropy over the len(tokens) - 1 targets of `tokens` (`model(x, y, reduction="sum")`),
    whatever the world size or batch size: block_size windows (the last may be shorter) dealt round-robin to ranks,
    as build-nanogpt does."""
    n = len(tokens) - 1
    if n < 1:
        raise ValueError(f"{len(tokens)} val tokens hold no target")
    starts = list(range(0, n, block_size))[rank::world_size]
    full = [s for s in starts if s + block_size <= n]
    # a shorter last window, when block_size does not divide n, goes in a batch of its own (it can only be the last)
    batches = [full[i : i + batch_size] for i in range(0, len(full), batch_size)] + [[s] for s in starts[len(full):]]
    was_training = model.training
    model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=device)  # summed loss, token count
    for batch in tqdm(batches, desc="val loss", unit="batch", disable=not progress, leave=False):
        length = min(block_size, n - batch[0])
        buf = np.stack([np.asarray(tokens[s : s + length + 1], dtype=np.int64) for s in batch])
        xy = torch.from_numpy(buf).to(device, non_blocking=True)
        x, y = xy[:, :-1], xy[:, 1:]
        with autocast_context(device, dtype):
            _, loss = model(x, y, reduction="sum")
        total[0] += loss.double()
        total[1] += y.numel()
    distributed.all_reduce_sum(total)
    model.train(was_training)
    return (total[0] / total[1]).item()


def scored_chars(tokens: np.ndarray, tokenizer: object) -> int:
    """How many characters the targets `val_loss` scores (tokens[1:]) decode to, document by document (end-of-text is
    scored but no character): a loss per character compares across tokenizers."""
    targets, eot = np.asarray(tokens[1:]), tokenizer.eot
    documents = np.split(targets, np.flatnonzero(targets == eot))  # each but the first opens with its eot
    return sum(len(tokenizer.decode(d[d != eot].tolist())) for d in documents)


def bits_per_char(loss: float, tokens: np.ndarray, tokenizer: object) -> float:
    """`val_loss` over `tokens` (nats per target token) as bits per character: loss x targets / characters / ln 2."""
    chars = scored_chars(tokens, tokenizer)
    if chars == 0:
        raise UserError(f"the {len(tokens) - 1:,} scored val tokens decode to no characters (only end-of-text "
                        f"tokens): bits per character is undefined; raise eval.val_tokens")
    return loss * (len(tokens) - 1) / chars / math.log(2)


def write_samples(path: Path, prompt: str, texts: list[str], model_spec: str) -> None:
    """Generated samples as a small text file (atomic), prompt shown once per sample."""
    write_text(path, "".join(f"--- sample {i} ({model_spec}) ---\n{prompt}{t}\n\n" for i, t in enumerate(texts)))


# --- the continuation scorer -------------------------------------------------------------------------------------

HEAD_CHUNK = 1024  # head positions per GPT.logits call: bounds the [positions, vocab] float32 logits in memory


@dataclass
class Example:
    """One multiple-choice item in token ids: `endings[label]` is the right continuation of `context`."""
    context: list[int]
    endings: list[list[int]]
    label: int
    index: int = 0
    where: str = ""  # file:line of the row it came from, for errors (empty: "example <index>")

    @property
    def name(self) -> str:
        """Where the example came from, for a message."""
        return self.where or f"example {self.index}"


@dataclass
class ChoiceResult:
    """Counts over all ranks and one prediction per example: index, label, pred (argmin summed loss), pred_norm
    (argmin mean loss), sum_losses and mean_losses (one per ending)."""
    count: int
    correct: int
    correct_norm: int
    acc: float
    acc_norm: float
    predictions: list[dict] = field(default_factory=list)
    examples_per_sec: float = 0.0


@dataclass
class Row:
    """One packed sequence [context | cont_0 | cont_1 | ...]: each continuation attends to the context and to itself,
    its position ids continuing the context's, so the context runs through the trunk once; `ids` number the
    continuations in `score_rows`' output."""
    context: list[int]
    continuations: list[list[int]]
    ids: list[int]

    def __len__(self) -> int:
        return len(self.context) + sum(len(c) - 1 for c in self.continuations)  # a last token is only a target


def _pack(rows: Sequence[Row]) -> tuple[torch.Tensor, ...]:
    """Rows packed: idx, pos [B, T]; attn_mask [B, 1, T, T] (True: may attend); head [P], flat positions through the
    head, each once; per target token (continuation by continuation) pair_head, its index into head, and target.
    Segments -1 padding, 0 context, j+1 continuation j; a continuation's last token is a target, never an input."""
    B, T = len(rows), max(len(r) for r in rows)
    idx, pos = torch.zeros(B, T, dtype=torch.long), torch.zeros(B, T, dtype=torch.long)
    seg = torch.full((B, T), -1, dtype=torch.long)
    head, pair_head, target = [], [], []
    for b, row in enumerate(rows):
        C = len(row.context)
        idx[b, :C], pos[b, :C], seg[b, :C] = torch.tensor(row.context, dtype=torch.long), torch.arange(C), 0
        shared, start = len(head), C  # the context's last position predicts every continuation's first token
        head.append(b * T + C - 1)
        for j, cont in enumerate(row.continuations):
            n = len(cont) - 1  # token k > 0 is predicted from token k - 1, the input at start + k - 1
            idx[b, start:start + n] = torch.tensor(cont[:-1], dtype=torch.long)
            pos[b, start:start + n] = torch.arange(C, C + n)
            seg[b, start:start + n] = j + 1
            pair_head += [shared, *range(len(head), len(head) + n)]
            head += range(b * T + start, b * T + start + n)
            target += cont
            start += n
    ar = torch.arange(T)
    mask = (ar[None, :] <= ar[:, None]) & ((seg[:, :, None] == seg[:, None, :]) | (seg[:, None, :] == 0))
    mask |= torch.eye(T, dtype=torch.bool)  # padding attends to itself: no all-masked softmax row
    return idx, pos, mask[:, None], torch.tensor(head), torch.tensor(pair_head), torch.tensor(target)


def _batch_scores(model: nn.Module, rows: Sequence[Row], vocab_size: int, device: torch.device,
                  dtype: torch.dtype | None, greedy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Per continuation of the rows: summed log-probability (float32) and whether each token is the argmax, on CPU.
    The head runs only where a continuation token is predicted."""
    idx, pos, attn_mask, head, pair_head, target = _pack(rows)
    with autocast_context(device, dtype):
        hidden = model.hidden_states(idx.to(device), pos=pos.to(device), attn_mask=attn_mask.to(device))
    hidden = hidden.flatten(0, 1)[head.to(device)]
    by_head = torch.argsort(pair_head, stable=True)  # then each chunk of head positions owns a run of pairs
    pair_head = pair_head[by_head]
    bounds = torch.searchsorted(pair_head, torch.arange(0, len(hidden) + HEAD_CHUNK, HEAD_CHUNK)).tolist()
    pair_head, target = pair_head.to(device), target[by_head].to(device)
    lp = torch.empty(len(by_head), device=device)
    hit = torch.ones(len(by_head), dtype=torch.bool, device=device)
    for c, start in enumerate(range(0, len(hidden), HEAD_CHUNK)):
        with autocast_context(device, dtype):
            logits = model.logits(hidden[start:start + HEAD_CHUNK])
        logits = without_padding(logits, vocab_size).float()
        lo, hi = bounds[c], bounds[c + 1]
        local, t = pair_head[lo:hi] - start, target[lo:hi]
        lp[lo:hi] = logits[local, t] - logits.logsumexp(dim=-1)[local]
        if greedy:  # an argmax pass over the logits: only lm-eval's is_greedy asks for it
            hit[lo:hi] = logits.argmax(dim=-1)[local] == t
    lengths = torch.tensor([len(c) for row in rows for c in row.continuations])  # the targets, in order
    owner, R = torch.repeat_interleave(torch.arange(len(lengths)), lengths)[by_head].to(device), len(lengths)
    sums = torch.zeros(R, device=device).index_add_(0, owner, lp)
    misses = torch.zeros(R, dtype=torch.long, device=device).index_add_(0, owner, (~hit).long())
    return sums.cpu(), (misses == 0).cpu()


@torch.no_grad()
def score_rows(model: nn.Module, rows: Sequence[Row], vocab_size: int, *, device: str | torch.device,
               dtype: torch.dtype | None = None, batch_size: int = 32, greedy: bool = False,
               progress: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """log P(continuation | context) per continuation id (float64 [n], n the rows' ids) and, with `greedy`, whether
    every token is the argmax. `model` needs `hidden_states(idx, pos=, attn_mask=)`, `logits` and `config`;
    `vocab_size` is the tokenizer's; `dtype` bf16/fp16 runs under autocast; the train/eval mode is restored."""
    device = torch.device(device)
    if not 0 < vocab_size <= model.config.vocab_size:
        raise ValueError(f"vocab_size={vocab_size}: must be in 1..{model.config.vocab_size}, the model's head")
    n = sum(len(r.ids) for r in rows)
    logprob, is_greedy = torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.bool)
    rows = sorted(rows, key=len, reverse=True)  # similar lengths share a forward; the longest (most memory) first
    was_training = model.training
    model.eval()
    try:
        for b in tqdm(range(0, len(rows), batch_size), desc="scoring", unit="batch", disable=not progress):
            chunk = rows[b:b + batch_size]
            sums, hits = _batch_scores(model, chunk, vocab_size, device, dtype, greedy)
            ids = [i for row in chunk for i in row.ids]
            logprob[ids], is_greedy[ids] = sums.double(), hits
    finally:
        model.train(was_training)
    return logprob, is_greedy


def fit_example(example: Example, block_size: int) -> tuple[list[int], list[list[int]]]:
    """The context (cut from the left) and endings such that every context+ending row fits block_size."""
    if not 0 <= example.label < len(example.endings):
        raise UserError(f"{example.name}: label {example.label} is not in 0..{len(example.endings) - 1}")
    if not example.context:
        raise UserError(f"{example.name}: empty context (the first ending token needs one to be predicted)")
    if min(len(e) for e in example.endings) == 0:
        raise UserError(f"{example.name}: an ending has no tokens")
    longest = max(len(e) for e in example.endings)
    if longest > block_size - 1:
        raise UserError(f"{example.name}: an ending of {longest} tokens does not fit block_size "
                        f"{block_size} with at least one context token")
    return example.context[-(block_size - longest):], example.endings


def _prediction(example: Example, sums: list[float], lengths: list[int]) -> dict:
    means = [s / n for s, n in zip(sums, lengths)]
    return {"index": example.index, "label": example.label,
            "pred": min(range(len(sums)), key=sums.__getitem__),
            "pred_norm": min(range(len(means)), key=means.__getitem__),
            "sum_losses": sums, "mean_losses": means}


def score_examples(model: nn.Module, examples: Sequence[Example], vocab_size: int, *, device: str | torch.device,
                   batch_size: int = 32, dtype: torch.dtype | None = None, rank: int | None = None,
                   world_size: int | None = None, progress: bool = True) -> ChoiceResult:
    """Multiple-choice examples, one row each through `score_rows`: the pick is the ending of least summed loss (acc)
    and of least mean loss per token (acc_norm); contexts longer than the block are cut from the left, endings never.
    rank/world_size default to torch.distributed's (else 0/1): this rank scores examples[rank::world_size] and every
    rank gets all predictions back in input order, so every rank must call this."""
    joined = dist.is_available() and dist.is_initialized()
    rank = (dist.get_rank() if joined else 0) if rank is None else rank
    world_size = (dist.get_world_size() if joined else 1) if world_size is None else world_size
    if world_size > 1 and not joined:
        raise ValueError(f"world_size={world_size} but torch.distributed is not initialised: counts could not be "
                         "combined across ranks")
    positions, rows, n = list(range(rank, len(examples), world_size)), [], 0
    for i in positions:
        context, endings = fit_example(examples[i], model.config.block_size)
        rows.append(Row(context, endings, list(range(n, n + len(endings)))))
        n += len(endings)
    t0 = time.perf_counter()
    logprob, _ = score_rows(model, rows, vocab_size, device=device, dtype=dtype, batch_size=batch_size,
                            progress=progress and rank == 0)
    losses = (-logprob).tolist()
    predictions = [_prediction(examples[i], [losses[k] for k in r.ids], [len(e) for e in r.continuations])
                   for i, r in zip(positions, rows)]
    if joined and world_size > 1:
        slots: list[dict] = [{}] * len(examples)
        for where, preds in distributed.all_gather_objects((positions, predictions)):
            for i, p in zip(where, preds):
                slots[i] = p
        predictions = slots
    if not predictions:  # an accuracy of zero examples is no number: the caller must refuse an empty task before this
        raise ValueError("no multiple-choice examples were scored: an accuracy over zero examples is undefined")
    count = len(predictions)
    correct = sum(p["pred"] == p["label"] for p in predictions)
    correct_norm = sum(p["pred_norm"] == p["label"] for p in predictions)
    seconds = time.perf_counter() - t0
    return ChoiceResult(count, correct, correct_norm, correct / count, correct_norm / count, predictions,
                        count / seconds if seconds > 0 else 0.0)


def write_predictions(path: str | Path, result: ChoiceResult) -> Path:
    """One JSON object per example (index, label, pred, pred_norm, sum_losses, mean_losses); atomic."""
    write_text(path, "".join(json.dumps(p) + "\n" for p in result.predictions))
    return Path(path)


# --- HellaSwag's rows: rowanz/hellaswag's data/hellaswag_val.jsonl, its size and sha256 those Hugging Face `datasets`
# recorded (hellaswag/dataset_infos.json), rendered as build-nanogpt does: the context, each ending as " " + ending --

HELLASWAG_VAL_URL = "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl"
HELLASWAG_VAL_SIZE = 12_246_618
HELLASWAG_VAL_SHA256 = "0aa3b88843990f3f10a97b9575c94d7b71fb2205240ba04ae4884d9e9c992588"
HELLASWAG_VAL_EXAMPLES = 10_042
HELLASWAG_VAL_NAME = "hellaswag_val.jsonl"

Transport = Callable[[str], Iterable[bytes]]  # a URL's bytes in chunks (tests pass a fake one)


def urllib_transport(url: str, timeout: float = 60.0, chunk: int = 1 << 16) -> Iterable[bytes]:
    """The body of `url` in blocks (the default transport; tests pass their own)."""
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        while block := resp.read(chunk):
            yield block


def _place_hint(dest: Path, key: str = "eval.hellaswag_path") -> str:
    return (f"place the official {HELLASWAG_VAL_NAME} ({HELLASWAG_VAL_SIZE:,} bytes, sha256 {HELLASWAG_VAL_SHA256}, "
            f"from {HELLASWAG_VAL_URL}) at {dest}, or set {key} to a local copy")


def fetch_hellaswag(dest_dir: str | Path = "data/hellaswag", path: str | Path | None = None,
                    transport: Transport | None = None, url: str = HELLASWAG_VAL_URL,
                    progress: bool = True, key: str = "eval.hellaswag_path") -> Path:
    """HellaSwag val: `path` as is (a local copy, set by the param `key`), else the verified copy in dest_dir,
    downloaded first when absent or damaged; a download is renamed into place only once its size and sha256 match."""
    if path is not None:
        if not Path(path).is_file():
            raise UserError(f"{key}={path}: no such file")
        return Path(path)
    dest = Path(dest_dir) / HELLASWAG_VAL_NAME
    if dest.is_file() and dest.stat().st_size == HELLASWAG_VAL_SIZE and file_sha256(dest) == HELLASWAG_VAL_SHA256:
        return dest
    h, size = hashlib.sha256(), 0
    with atomic_write(dest, "wb") as f, tqdm(total=HELLASWAG_VAL_SIZE, unit="B", unit_scale=True,
                                             desc=HELLASWAG_VAL_NAME, disable=not progress) as bar:
        try:
            for block in (transport or urllib_transport)(url):
                f.write(block)
                h.update(block)
                size += len(block)
                bar.update(len(block))
        except (urllib.error.URLError, OSError, TimeoutError) as e:
            raise UserError(f"could not download {url} ({e}); {_place_hint(dest, key)}") from e
        if size != HELLASWAG_VAL_SIZE:
            what = "truncated" if size < HELLASWAG_VAL_SIZE else "too long"
            raise UserError(f"{url}: download {what}, got {size:,} of {HELLASWAG_VAL_SIZE:,} bytes; "
                            f"nothing was written to {dest}")
        if h.hexdigest() != HELLASWAG_VAL_SHA256:
            raise UserError(f"{url}: sha256 {h.hexdigest()} does not match the expected {HELLASWAG_VAL_SHA256}; "
                            f"nothing was written to {dest}")
    return dest


def _int_field(item: dict, key: str, where: str) -> int:
    """An integer field: an int (not a bool) or a string of digits, as some copies store the label."""
    value = item[key]
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise UserError(f"{where}: {key} {value!r} is not an integer")
    try:
        return int(value)
    except ValueError:
        raise UserError(f"{where}: {key} {value!r} is not an integer") from None


def parse_hellaswag_line(raw: bytes, where: str, default_ind: int) -> dict:
    """One jsonl line -> {ind, ctx, endings, label}; a UserError starting with `where` (file:line) otherwise."""
    try:
        item = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise UserError(f"{where}: not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{where}: not valid JSON ({e.msg})") from None
    if not isinstance(item, dict):
        raise UserError(f"{where}: a JSON {type(item).__name__}, expected an object with ctx, endings, label")
    if missing := [key for key in ("ctx", "endings", "label") if key not in item]:
        raise UserError(f"{where}: missing field {missing[0]!r}")
    if not isinstance(item["ctx"], str):
        raise UserError(f"{where}: 'ctx' is {type(item['ctx']).__name__}, not a string")
    endings = item["endings"]
    if not (isinstance(endings, list) and len(endings) == 4 and all(isinstance(e, str) for e in endings)):
        got = f"{len(endings)} items" if isinstance(endings, list) else type(endings).__name__
        raise UserError(f"{where}: 'endings' must be a list of 4 strings (got {got})")
    label = _int_field(item, "label", where)
    if not 0 <= label < 4:
        raise UserError(f"{where}: label {label} is not in 0..3")
    ind = _int_field(item, "ind", where) if "ind" in item else default_ind
    return {"ind": ind, "ctx": item["ctx"], "endings": endings, "label": label}


def read_hellaswag(path: str | Path, limit: int | None = None) -> list[dict]:
    """The items (ctx, endings, label, ind, line) of a HellaSwag jsonl file, checked field by field: a bad line or a
    file without examples is a UserError naming the file (and line)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: HellaSwag file not found; {_place_hint(path)}")
    items: list[dict] = []
    with open(path, "rb") as f:  # bytes: a non-UTF-8 line is reported with its number, not as a codec error
        for lineno, raw in enumerate(f, start=1):
            if limit is not None and len(items) >= limit:
                break
            if raw.strip():
                items.append({**parse_hellaswag_line(raw, f"{path}:{lineno}", len(items)), "line": lineno})
    if not items and limit != 0:  # no accuracy is ever written from zero examples
        raise UserError(f"{path}: no HellaSwag examples in the file (it is empty or holds only blank lines); "
                        f"{_place_hint(path)}")
    return items


def load_hellaswag(path: str | Path, tokenizer: Tokenizer, limit: int | None = None,
                   block_size: int | None = None) -> list[Example]:
    """HellaSwag items as token Examples: context encode(ctx), ending i encode(" " + endings[i]); with `block_size`,
    each is checked to fit the model now, so a bad row stops the run before any pass."""
    items = read_hellaswag(path, limit)
    contexts = tokenizer.encode_batch([it["ctx"] for it in items])
    endings = tokenizer.encode_batch([" " + e for it in items for e in it["endings"]])
    examples = [Example(context=contexts[n], endings=endings[4 * n:4 * n + 4], label=it["label"], index=it["ind"],
                        where=f"{path}:{it['line']}") for n, it in enumerate(items)]
    if block_size is not None:
        for ex in examples:
            fit_example(ex, block_size)
    return examples


def hellaswag_examples(tokenizer: Tokenizer, path: str | Path | None, limit: int | None, key: str,
                       dest_dir: str | Path = "data/hellaswag", progress: bool = True,
                       block_size: int | None = None) -> list[Example]:
    """The first `limit` examples of `path` or the verified download in `dest_dir` (`fetch_hellaswag`), rendered
    with `tokenizer` and checked against `block_size` (`load_hellaswag`), as training and evaluate score them."""
    return load_hellaswag(fetch_hellaswag(dest_dir, path=path, progress=progress, key=key), tokenizer, limit=limit,
                          block_size=block_size)


def hellaswag_file(path: str | Path | None, dest_dir: str | Path = "data/hellaswag") -> dict[str, str]:
    """What a HellaSwag figure was measured on: the file read (`path`, else the verified download) and its sha256."""
    file = Path(path) if path is not None else Path(dest_dir) / HELLASWAG_VAL_NAME
    return {"file": str(file), "sha256": file_sha256(file)}
