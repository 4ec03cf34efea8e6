"""HellaSwag's validation file: rowanz/hellaswag's data/hellaswag_val.jsonl, downloaded and checked against the
size and sha256 Hugging Face `datasets` recorded (hellaswag/dataset_infos.json), parsed field by field, and rendered
as build-nanogpt does: the context, each ending as " " + ending."""
from __future__ import annotations

import hashlib
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
from tqdm import tqdm

from gptcore.atomic import atomic_write
from gptcore.data.tokenizers.base import Tokenizer
from gptcore.digests import file_sha256
from gptcore.errors import UserError
from gptcore.eval.scorer import Example, fit_example
from gptcore.eval.tasks.base import Task, TaskSettings

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
    seen: dict[int, int] = {}  # ind -> the line it first came on
    with open(path, "rb") as f:  # bytes: a non-UTF-8 line is reported with its number, not as a codec error
        for lineno, raw in enumerate(f, start=1):
            if limit is not None and len(items) >= limit:
                break
            if raw.strip():
                item = parse_hellaswag_line(raw, f"{path}:{lineno}", len(items))
                if item["ind"] in seen:  # scored twice, it would count twice in every accuracy
                    raise UserError(f"{path}:{lineno}: example ind {item['ind']} again (first on line "
                                    f"{seen[item['ind']]}): a HellaSwag file holds each example once; "
                                    f"{_place_hint(path)}")
                seen[item["ind"]] = lineno
                items.append({**item, "line": lineno})
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


def _examples(cfg: TaskSettings, tok: Tokenizer, tokens: np.ndarray, block_size: int,
              progress: bool = False) -> list[Example]:
    return hellaswag_examples(tok, cfg.hellaswag_path, cfg.hellaswag_examples, f"{cfg.section}.hellaswag_path",
                              progress=progress, block_size=block_size)


TASK = Task(_examples, record=lambda cfg: hellaswag_file(cfg.hellaswag_path))
