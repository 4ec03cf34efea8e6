"""Your own files (`fetch.source: local`): parquet, jsonl or txt files, a folder of them or a glob; data/local/ is the
folder dvc.yaml's fetch stage watches. They are read as they are: each symbolic link on the way is named in
fetch.json (and by the stage), one leading out of the project is refused unless fetch.path names where it leads, a
text file's byte-order mark is dropped, and a file that changes while fetch reads it publishes nothing."""
from __future__ import annotations

import codecs
import configparser
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


def named(path: str) -> Path:
    """The place fetch.path names: the file or folder itself, or a glob's folders before its first wildcard."""
    return Path(".", *itertools.takewhile(lambda part: not re.search(r"[*?[]", part), Path(path).parts))


def watched(path: str) -> bool:
    """Whether DVC sees a change to fetch.path's files: they are under WATCHED (a glob's folders before its first
    wildcard are)."""
    return Path(os.path.abspath(named(path))).is_relative_to(WATCHED.absolute())


def _on_the_way(file: Path, start: Path) -> Iterator[Path]:
    """The symbolic links among `file` and its folders below `start` (`start` itself included)."""
    rel = Path(os.path.abspath(file)).relative_to(start)
    for depth in range(0, len(rel.parts) + 1):
        step = start.joinpath(*rel.parts[:depth])
        if step.is_symlink():
            yield step


def _dvc_cache() -> list[Path]:
    """The DVC cache folder the project's .dvc/config (or config.local) sets, where it sets one: with cache.type
    symlink, `dvc add data/local/mine.txt` leaves a link there (a shared cache often lies outside the project)."""
    found = []
    for name in ("config", "config.local"):
        config = configparser.ConfigParser(strict=False, interpolation=None)
        try:
            config.read(Path(".dvc") / name, encoding="utf-8")
        except (configparser.Error, UnicodeDecodeError):  # DVC reads its own config; a cache is only an allowance
            continue
        if config.has_option("cache", "dir"):
            found.append(Path(os.path.realpath(Path(".dvc") / config.get("cache", "dir"))))
    return found


def _allowed(place: Path) -> tuple[Path, ...]:
    """Where a symbolic link may lead: into the project, the place fetch.path names, or the project's DVC cache."""
    return (Path(os.path.realpath(Path.cwd())), Path(os.path.realpath(place)), *_dvc_cache())


def _leads_out(link: Path, place: Path, file: Path | None = None) -> UserError:
    """The one line for `link`, which leads out of the project, on the way to `file` (fetch.path names `place`)."""
    there = os.path.realpath(link)
    on_the_way = f"{file}: " if file is not None and Path(file) != link else ""
    return UserError(f"{on_the_way}{link} is a symbolic link to {there}, outside the project: fetch reads nothing a "
                     f"link leads out of the project to unseen; set fetch.path to {link} to read it on purpose, or "
                     f"copy what it leads to into {place}")


def check_links(path: str, files: list[Path]) -> dict[str, str]:
    """Each symbolic link on the way to `files` (inside the project: from its root down; elsewhere: from the place
    fetch.path names down) with where it leads, resolved. A file a link leads out of the project is a UserError
    unless it lies in the place fetch.path names (resolved), which the user chose, or in the DVC cache, where DVC
    put it: a link in data/local/ to /etc/passwd would be trained on unseen."""
    root = Path.cwd()
    place = Path(os.path.abspath(named(path)))
    allowed = _allowed(place)
    found: dict[str, str] = {}
    for f in files:
        start = root if Path(os.path.abspath(f)).is_relative_to(root) else place
        links = list(_on_the_way(f, start))
        links = [k.relative_to(root) if k.is_relative_to(root) else k for k in links]
        for link in links:
            found.setdefault(str(link), os.path.realpath(link))
        if links and not any(Path(os.path.realpath(f)).is_relative_to(a) for a in allowed):
            out = [k for k in links if not any(Path(os.path.realpath(k)).is_relative_to(a) for a in allowed)]
            raise _leads_out(out[0] if out else links[-1], named(path), f)
    return found


def _identity(path: Path) -> tuple[int, ...]:
    """What changes when a file is written, replaced or touched: device, inode, size, modification and change time
    (the change time no user can set back)."""
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _changed(path: Path, before: tuple[int, ...]) -> str | None:
    """How `path` differs from its identity `before` (None: unchanged)."""
    try:
        now = _identity(path)
    except FileNotFoundError:
        return "removed"
    if now == before:
        return None
    if now[:2] != before[:2]:
        return "replaced by another file"
    if now[2] != before[2]:
        return f"{before[2]:,} -> {now[2]:,} bytes"
    return "rewritten"


def _walk(folder: Path) -> Iterator[Path]:
    """Every file under `folder`, into folders a symbolic link leads to as well (as a glob's `**` goes), each real
    folder once (a link to a folder above would loop). A linked folder out of the project and out of `folder` is
    refused before it is entered (a link to / would walk the whole disk first)."""
    allowed = _allowed(folder)
    seen: set[str] = set()
    for top, folders, names in os.walk(folder, followlinks=True):
        seen.add(os.path.realpath(top))
        for d in folders:
            step = Path(top, d)
            if step.is_symlink() and not any(Path(os.path.realpath(step)).is_relative_to(a) for a in allowed):
                raise _leads_out(step, folder)
        folders[:] = [d for d in folders if os.path.realpath(os.path.join(top, d)) not in seen]
        yield from (Path(top, name) for name in names)


def local_files(path: str | Path) -> list[Path]:
    """A file, a directory (its parquet/jsonl/txt files, recursively) or a glob -> sorted files."""
    p = Path(path)
    if p.is_file():
        files = [p]
    elif p.is_dir():
        files = sorted(f for f in _walk(p) if f.is_file() and f.suffix in LOCAL_SUFFIXES)
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
            if lineno == 1:
                raw = raw.removeprefix(codecs.BOM_UTF8)  # the file's byte-order mark, not the first object's text
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
        text = read_utf8(path).replace("\r\n", "\n")  # a byte-order mark dropped
        yield from _batched([d for d in re.split(rf"(?m)^{re.escape(EOT_LINE)}\n?", text) if d.strip()], batch_docs)


def check(p: FetchConfig) -> None:
    """fetch.path is given."""
    if not p.path:
        raise ParamError("fetch.path", p.path, "required for source local (a file, a directory or a glob)")


def fetch(p: FetchConfig, out_dir: Path, progress: bool, transport: Any = None) -> dict:
    """The files fetch.path names into out_dir/local/; the record names the symbolic links on the way (`links`). A
    file that changed while fetch read it, or a file added or removed meanwhile, is a UserError before anything is
    published: DVC hashes the files after the stage, so it would record text the documents do not hold."""
    listing = local_files(p.path)
    files = listing[: p.max_files]
    links = check_links(p.path, files)
    read: dict[Path, tuple[int, ...]] = {}  # each file's identity before it was opened

    def batches() -> Iterator[list[str]]:
        for f in files:
            read[f] = _identity(f)
            yield from read_local_file(f, p.text_column)

    def unchanged() -> None:
        for f, before in read.items():
            if (how := _changed(f, before)) is not None:
                raise UserError(f"{f} changed while fetch read it ({how}): nothing was published; run fetch again "
                                f"once nothing writes to it")
        now = local_files(p.path)
        if now != listing:
            diff = [f"{f} added" for f in now if f not in listing] + [f"{f} removed" for f in listing if f not in now]
            raise UserError(f"fetch.path={p.path!r}: files came or went while fetch read them ({', '.join(diff)}): "
                            f"nothing was published; run fetch again once nothing writes there")

    # max_docs may stop the reading before the last file: the record counts the files read
    return publish_documents(batches(), out_dir, "local", p.path, "local", p.max_docs, progress,
                             before_swap=unchanged, also={"links": links} if links else None, files_read=read)


SOURCE = Source(check, fetch)
