"""What the checkpoints' digests cost: the time of a save and of a resume at the 124M shape (GPT-2 small: 12 blocks of
768, vocabulary 50,304, AdamW), on one process on the CPU, with the digests and without.

- save: gptcore.train.checkpoints.save, the trainer's own (weights and AdamW's state through
  torch.distributed.checkpoint, the record, digests.json, the rename). Without digests, the same save with the hashing
  stream swapped for one that only writes (its digests.json then lists empty digests).
- resume: with digests, `checkpoints.read` (every file's sha256 checked) and `checkpoints.load` (the tensors read into
  the model and its optimizer); without, `load` alone.

The two variants take turns (bench/rounds.py: with, without, with, without, ...), after an untimed warm-up round, so a
drift of the machine lands on both alike. Each figure is the median over rounds with its range (min-max); the cost of
the digests is the median of the per-round ratios. A save writes a new folder under --dir, deleted after it off the
clock. The files a resume reads were just written, so they come from the page cache, for both variants alike;
on a quiet machine with --dir on the disk checkpoints/ lives on, the figures are those of a run's saves. Not
controlled: other work on the machine, the disk's own caching.

    python bench/bench_checkpoint.py                # the 124M shape, 5 rounds: 1.5 GB a save, a few minutes
    python bench/bench_checkpoint.py --tiny         # 2 blocks of 64 wide, 2 rounds: checks the script runs (CI)
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.rounds import fmt, ratios, time_rounds  # noqa: E402


class _Unhashed:
    """The hashing stream's interface without the hash: what a save costs without digests."""

    def __init__(self, f: Any) -> None:
        self._f, self.size, self.sha256, self.error = f, 0, None, None

    def write(self, data: Any) -> int:
        n = self._f.write(data)
        self.size += n
        return n

    def tell(self) -> int:
        return self._f.tell()

    def fileno(self) -> int:
        return self._f.fileno()

    def flush(self) -> None:
        self._f.flush()

    def writable(self) -> bool:
        return True

    def close(self) -> None:
        if self.sha256 is None:
            self._f.close()
            self.sha256 = ""

    def __enter__(self) -> _Unhashed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextmanager
def without_digests() -> Iterator[None]:
    """Inside: every file a save writes goes through _Unhashed instead of the hashing stream."""
    from gptcore.model import checkpoint_file
    from gptcore.train import checkpoints

    real = checkpoints.HashingWriter
    checkpoints.HashingWriter = checkpoint_file.HashingWriter = _Unhashed
    try:
        yield
    finally:
        checkpoints.HashingWriter = checkpoint_file.HashingWriter = real


def mount_of(path: Path) -> str:
    """The mount point `path` is on, and its file system type (Linux /proc/mounts), for the report."""
    path = path.resolve()
    best = ("/", "?")
    for line in Path("/proc/mounts").read_text().splitlines() if Path("/proc/mounts").exists() else []:
        _, point, kind, *_ = line.split()
        if (path == Path(point) or Path(point) in path.parents) and len(point) >= len(best[0]):
            best = (point, kind)
    return f"{best[0]} ({best[1]})"


def main_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line's options (the test of the tiny run passes them too)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n-layer", type=int, default=12)
    ap.add_argument("--n-head", type=int, default=12)
    ap.add_argument("--n-embd", type=int, default=768)
    ap.add_argument("--block-size", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", type=Path, default=None, help="where the checkpoints are written (default: a temp folder "
                                                          "in the system's temp dir); put it on checkpoints/'s disk")
    ap.add_argument("--tiny", action="store_true", help="2 blocks of 64 wide, vocabulary 512, 2 rounds: checks the "
                                                        "script runs")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Measure and print (see the module docstring)."""
    args = main_args(argv)
    if args.tiny:
        args.n_layer, args.n_head, args.n_embd, args.block_size, args.vocab, args.rounds = 2, 2, 64, 64, 512, 2
    import torch

    from gptcore.model.gpt import GPT, GPTConfig
    from gptcore.train import checkpoints
    from gptcore.train.config import TrainConfig
    from gptcore.train.optimizers import build_optimizers

    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd, block_size=args.block_size,
                          vocab_size=args.vocab))
    cfg = TrainConfig.read({"micro_batch": 1, "total_batch_tokens": args.block_size, "max_steps": 10,
                            "warmup_steps": 0, "max_lr": 6e-4, "eval_every": 0, "ckpt_every": 10})
    opts = build_optimizers(model, cfg, "cpu")
    record = {"params": {"bench": True}, "fingerprint": "bench", "step": 0}
    base = Path(tempfile.mkdtemp(prefix="bench_checkpoint_", dir=args.dir))

    def save_with() -> None:
        checkpoints.save(base / "saves", 1, model, opts, record, keep=10)

    def save_without() -> None:
        with without_digests():
            checkpoints.save(base / "saves", 1, model, opts, record, keep=10)

    def tidy() -> None:  # after each save, off the clock: the next one writes a new folder, as a run's do
        shutil.rmtree(base / "saves", ignore_errors=True)

    try:
        checkpoints.save(base / "resume", 0, model, opts, record, keep=1)
        folder = base / "resume" / "ckpt_0000000"
        known = checkpoints.read(folder)

        def resume_with() -> None:
            checkpoints.load(checkpoints.read(folder), model, opts)

        def resume_without() -> None:
            checkpoints.load(known, model, opts)

        saves = time_rounds({"with": save_with, "without": save_without}, rounds=args.rounds, after=tidy)
        resumes = time_rounds({"with": resume_with, "without": resume_without}, rounds=args.rounds)
        files = {p.name: p.stat().st_size for p in sorted(folder.iterdir())}
    finally:
        shutil.rmtree(base, ignore_errors=True)
    weights = sum(p.numel() for p in model.parameters())
    print(f"{args.n_layer} blocks x {args.n_embd} wide, vocabulary {args.vocab} ({weights / 1e6:.1f}M weights), "
          f"fp32, AdamW; one process, {torch.get_num_threads()} threads; checkpoints in {mount_of(base)}; "
          f"{args.rounds} rounds, median (min-max) over rounds")
    print(f"a checkpoint: {sum(files.values()) / 1e6:,.1f} MB in " + ", ".join(f"{n} {b / 1e6:,.2f} MB"
                                                                             for n, b in files.items()))
    for what, timed in (("save", saves), ("resume", resumes)):
        cost = [r - 1 for r in ratios(timed.seconds["with"], timed.seconds["without"])]
        print(f"{what:6}  with digests {fmt(timed.seconds['with'], '.3f', unit=' s')}, without "
              f"{fmt(timed.seconds['without'], '.3f', unit=' s')}; the digests cost {fmt(cost, '+.1f', 100, '%')}")
    print("goal: the digests cost at most 5% of a save")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
