"""`gptcore-verify-shards`: every shard reread against its manifest (size, dtype, token and document counts,
sha256), each problem a line naming the file."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gptcore.data.shards import MANIFEST, CorruptManifest, ManifestMissing, check_files, read_manifest
from gptcore.errors import one_line_errors


def verify(shard_dir: str | Path) -> list[str]:
    """Recheck every shard against manifest.json (size, dtype, token and document counts, sha256): the problems."""
    shard_dir = Path(shard_dir)
    try:
        m = read_manifest(shard_dir)
    except (ManifestMissing, CorruptManifest) as e:
        return [str(e)]
    problems = []
    if m.get("complete") is not True:
        problems.append(f"{shard_dir / MANIFEST}: the tokenize run has not finished ({len(m['shards'])} shards so far)")
    return problems + check_files(shard_dir, m, full=True)


def main(argv: list[str] | None = None) -> int:
    """gptcore-verify-shards [shard_dir]: recheck shards against manifest.json; exit 1 on any problem."""
    ap = argparse.ArgumentParser(prog="gptcore-verify-shards", description=main.__doc__)
    ap.add_argument("shard_dir", nargs="?", default="data/shards")
    args = ap.parse_args(argv)
    with one_line_errors("gptcore-verify-shards"):  # a disk that cannot be read is one line too
        return _report(args.shard_dir)


def _report(shard_dir: str) -> int:
    problems = verify(shard_dir)
    if problems:
        print("\n".join(problems))
        print(f"{len(problems)} problem(s) in {shard_dir}", file=sys.stderr)
        return 1
    m = read_manifest(shard_dir)
    tokens = sum(s["tokens"] for s in m["shards"])
    print(f"ok: {len(m['shards'])} shards, {tokens:,} tokens, {m['dtype']}, tokenizer {m['tokenizer']['name']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
