"""A Hugging Face hub dataset (`fetch.source: hub`), FineWeb-Edu for the GPT-2 presets: its parquet files downloaded as
they are, each checked against the hub's listing at the commit fetch.json records."""
from __future__ import annotations

import hashlib
import socket
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Iterable

from gptcore.atomic import write_json
from gptcore.data.config import FetchConfig
from gptcore.data.corpus import FETCH_RECORD, open_parquet
from gptcore.data.sources.base import Source
from gptcore.digests import file_sha256
from gptcore.errors import UserError, cause
from gptcore.params import ParamError


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
            f"copy that folder here, then run again with -S fetch.source=local -S fetch.path={local} (not an edit "
            "of params.yaml, which dvc exp run composes afresh)")


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


def check(p: FetchConfig) -> None:
    """fetch.name, the dataset id, is given."""
    if not p.name:
        raise ParamError("fetch.name", p.name, "required for source hub (a dataset id, e.g. HuggingFaceFW/fineweb-edu)")


def fetch(p: FetchConfig, out_dir: Path, progress: bool, transport: HfHubTransport | None = None) -> dict:
    """The dataset's files into out_dir/hub/ (`transport`: how it talks to the hub, a fake in tests)."""
    return fetch_hub(p.name, p.config, out_dir, text_column=p.text_column, max_files=p.max_files,
                     max_docs=p.max_docs, revision=p.revision, transport=transport)


SOURCE = Source(check, fetch)
