"""Every bench script runs end to end at a tiny shape (--tiny), so none can rot; the figures are not checked."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_bench(script: str, *args: str) -> str:
    out = subprocess.run([sys.executable, str(ROOT / "bench" / script), *args], cwd=ROOT, capture_output=True,
                         text=True, timeout=900, env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


@pytest.mark.slow
def test_bench_train_tiny():
    out = run_bench("bench_train.py", "--tiny")
    for row in ("matmul", "nanoGPT-style fp32 eager", "stage fp32", "stage default", "target: stage fp32"):
        assert row in out


@pytest.mark.slow
def test_bench_hellaswag_tiny():
    out = run_bench("bench_hellaswag.py", "--tiny", "--path", str(ROOT / "no-such-file.jsonl"))
    assert "synthetic" in out and "FLOP ceiling" in out and "float32" in out


@pytest.mark.slow
def test_bench_gpu_tiny():
    out = run_bench("bench_gpu.py", "--tiny")
    assert "gpt2_124m" in out and "modern_124m" in out and "expected from published figures" in out


@pytest.mark.slow
def test_bench_tokenize_tiny():
    """The figures the lead reads are all there: stage against the ceiling, serial fraction, Amdahl's projection."""
    out = run_bench("bench_tokenize.py", "--tiny")
    lines = out.splitlines()
    header = next(line for line in lines if line.lstrip().startswith("encoder") and "serial" in line)
    assert all(col in header.split() for col in ("stage/ceil", "serial", "E16", "E64", "E128"))
    for encoder in ("tiktoken", "gigatoken"):
        summary = [line for line in lines if line.lstrip().startswith(f"{encoder} ") and "of the parallel ceiling" in line]
        assert len(summary) == 1, out[-3000:]
        assert "serial fraction" in summary[0] and all(f"{n} cores" in summary[0] for n in (16, 64, 128))


def test_bench_tokenize_help_says_how_to_run_it():
    out = run_bench("bench_tokenize.py", "--help")
    assert "quiet" in out and "--tiny" in out and "Amdahl" in out
