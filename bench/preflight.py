"""The device check's first ten seconds: every import its steps need, named when missing, before any long step.

bench/device_check.sh runs the GPU bench, the CUDA tests and the first-GPU-hour run with the machine's own python3.
They need the third-party packages in IMPORTS and nothing else; the project's modules those steps import (ENTRIES)
are imported too, so that a package one of them pulls in and IMPORTS forgot is named here, not minutes later. It
prints the versions found and exits 0, or names each missing import with the distribution that provides it and
exits 1. `--wheels` prints those distributions (torch left out: the machine's own CUDA build) pinned at this
environment's versions, with what they require, one `name==version` a line: bench/device_wheels.sh downloads them.

    python bench/preflight.py             # versions, or what is missing
    python bench/preflight.py --wheels    # the pins bench/device_wheels.sh fetches
"""
from __future__ import annotations

import argparse
import importlib
import importlib.metadata as metadata
import platform
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # the tests import their helpers (stagekit) as pytest does

# import name -> the distribution that provides it: all the device check's steps need beyond the standard library
IMPORTS = {"torch": "torch", "numpy": "numpy", "yaml": "PyYAML", "psutil": "psutil", "safetensors": "safetensors",
           "tiktoken": "tiktoken", "tqdm": "tqdm", "pytest": "pytest"}
# the project's modules the steps run: the GPU bench, the first-GPU-hour check, the CUDA tests' files
ENTRIES = ["bench.bench_gpu", "bench.first_hour", "tests.test_model", "tests.test_modern", "tests.test_fsdp"]


def missing_imports(imports: dict[str, str] = IMPORTS, entries: list[str] = ENTRIES) -> list[str]:
    """One line per import that fails: the module, the distribution to install, what needed it, the error."""
    lines = []
    for module, dist in imports.items():
        try:
            importlib.import_module(module)
        except ImportError as e:
            lines.append(f"{module} (pip: {dist}): {e}")
    if lines:  # the entries would fail on the same imports
        return lines
    for entry in entries:
        try:
            importlib.import_module(entry)
        except ModuleNotFoundError as e:
            if e.name and e.name.split(".")[0] in ("bench", "tests", "gptcore"):
                raise  # the project's own module: a bug, with its traceback
            lines.append(f"{e.name} (needed by {entry}, not in bench/preflight.py's IMPORTS): {e}")
    return lines


def versions() -> str:
    """Python, torch with its CUDA and device, and every distribution of IMPORTS, as one line."""
    import torch

    cuda = (f"CUDA {torch.version.cuda}, {torch.cuda.get_device_name()}" if torch.cuda.is_available()
            else "no CUDA device")
    found = ", ".join(f"{dist} {metadata.version(dist)}" for dist in IMPORTS.values())
    return f"Python {platform.python_version()}; {found}; {cuda}"


def requirement_names(dist: str) -> list[str]:
    """The distributions `dist` requires on this interpreter (extras and markers that do not apply left out)."""
    from packaging.requirements import Requirement

    out = []
    for line in metadata.requires(dist) or []:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            out.append(req.name)
    return out


def closure(dists: list[str], skip: set[str]) -> list[str]:
    """`dists` and all they require, transitively, as installed here, less `skip` and what only it requires."""
    seen: dict[str, str] = {}
    todo = [d for d in dists if canonical(d) not in skip]
    while todo:
        name = canonical(todo.pop())
        if name in seen or name in skip:
            continue
        seen[name] = metadata.version(name)
        todo.extend(requirement_names(name))
    return [f"{name}=={version}" for name, version in sorted(seen.items())]


def canonical(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def main(argv: list[str] | None = None) -> int:
    """Print the versions (exit 0) or what is missing (exit 1); --wheels: the pins to carry."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--wheels", action="store_true", help="print the distributions to carry, pinned, with their needs")
    args = ap.parse_args(argv)
    if args.wheels:
        torch_and_its = {canonical(d) for d in ["torch", *requirement_names("torch")]}
        print("\n".join(closure([d for d in IMPORTS.values() if d != "torch"], torch_and_its)))
        return 0
    t0 = time.perf_counter()
    missing = missing_imports()
    if missing:
        print("preflight: missing imports, nothing else was run:\n  " + "\n  ".join(missing)
              + "\nbring them as wheels: bench/device_wheels.sh here, then carry .whl (bench/device_check.sh says how)")
        return 1
    print(f"preflight: every import found in {time.perf_counter() - t0:.1f} s: {versions()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
