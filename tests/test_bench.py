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
def test_bench_tokenize_small():
    """bench_tokenize at its smallest corpus that holds its 1M val tokens, one encoder."""
    out = run_bench("bench_tokenize.py", "--sizes-mb", "5", "--encoders", "tiktoken", "--no-imap")
    assert out.strip()
