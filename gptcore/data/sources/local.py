"""Your own files (`fetch.source: local`): parquet, jsonl or txt files, a folder of them or a glob; data/local/ is the
folder dvc.yaml's fetch stage watches."""
from __future__ import annotations

import glob as _glob
import itertools
import json
import os
import re
from pathlib import Path
from typing import Any, Iterator

from gptcore.data.config import FetchConfig
from gptcore.data.corpus import column_texts, open_parquet
from gptcore.data.sources.base import ROW_GROUP_DOCS, Source, _batched, publish_documents
from gptcore.errors import UserError
from gptcore.params import ParamError
from gptcore.user_files import read_utf8

LOCAL_SUFFIXES = (".parquet", ".jsonl", ".txt")
EOT_LINE = "<|endoftext|>"  # in a txt file, a line holding only this separates documents
_SURROGATE = re.compile("[\ud800-\udfff]")
WATCHED = Path("data/local")  # dvc.yaml's fetch stage depends on this folder: a change in it reruns fetch


def watched(path: str) -> bool:
    """Whether DVC sees a change to fetch.path's files: they are under WATCHED (a glob's folders before its first
    wildcard are)."""
    fixed = itertools.takewhile(lambda part: not re.search(r"[*?[]", part), Path(path).parts)
    return Path(os.path.abspath(Path(".", *fixed))).is_relative_to(WATCHED.absolute())


def local_files(path: str | Path) -> list[Path]:
    """A file, a directory (its parquet/jsonl/txt files, recursively) or a glob -> sorted files."""
    p = Path(path)
    if p.is_file():
        files = [p]
    elif p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix in LOCAL_SUFFIXES)
    else:
        files = sorted(Path(f) for f in _glob.glob(str(path), recursive=True) if Path(f).is_file())
    if not files:
        raise UserError(f"fetch.path={str(path)!r}: no files found (put your .parquet, .jsonl or .txt files there, "
                        f"or set fetch.path)")
    if bad := [f for f in files if f.suffix not in LOCAL_SUFFIXES]:
        raise UserError(f"{bad[0]}: unsupported file type {bad[0].suffix!r} (use {', '.join(LOCAL_SUFFIXES)})")
    return files


def _jsonl_texts(path: Path, text_column: str) -> Iterator[str]:
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except ValueError as e:  # includes UnicodeDecodeError
                raise UserError(f"{path}: line {lineno}: not a JSON object ({e})") from None
            if not isinstance(obj, dict) or text_column not in obj:
                raise UserError(f"{path}: line {lineno}: no text field {text_column!r}; set fetch.text_column")
            text = obj[text_column]
            if not isinstance(text, str):
                raise UserError(f"{path}: line {lineno}: {text_column!r} is {type(text).__name__}, not a string")
            if (m := _SURROGATE.search(text)) is not None:  # JSON can spell one (\ud800), UTF-8 cannot
                raise UserError(f"{path}: line {lineno}: {text_column!r} holds a lone surrogate "
                                f"(\\u{ord(m.group()):04x} at character {m.start()}), which is not text; "
                                f"fix or drop that line")
            yield text


def read_local_file(path: Path, text_column: str, batch_docs: int = ROW_GROUP_DOCS) -> Iterator[list[str]]:
    """Documents of one local file in batches; bad input is a UserError naming the file and row or line."""
    if path.suffix == ".parquet":
        row = 0
        for batch in open_parquet(path, text_column).iter_batches(batch_size=batch_docs, columns=[text_column]):
            docs = column_texts(batch.column(0), path, row)
            yield docs
            row += len(docs)
    elif path.suffix == ".jsonl":
        yield from _batched(_jsonl_texts(path, text_column), batch_docs)
    else:  # .txt (local_files refused any other): one document, or several separated by lines holding only EOT_LINE
        text = read_utf8(path).replace("\r\n", "\n")
        yield from _batched([d for d in re.split(rf"(?m)^{re.escape(EOT_LINE)}\n?", text) if d.strip()], batch_docs)


def check(p: FetchConfig) -> None:
    """fetch.path is given."""
    if not p.path:
        raise ParamError("fetch.path", p.path, "required for source local (a file, a directory or a glob)")


def fetch(p: FetchConfig, out_dir: Path, progress: bool, transport: Any = None) -> dict:
    """The files fetch.path names into out_dir/local/."""
    files, read = local_files(p.path)[: p.max_files], []

    def batches() -> Iterator[list[str]]:
        for f in files:  # max_docs may stop the reading before the last file
            read.append(f)
            yield from read_local_file(f, p.text_column)
    return publish_documents(batches(), out_dir, "local", p.path, "local", p.max_docs, progress, files_read=read)


SOURCE = Source(check, fetch)
