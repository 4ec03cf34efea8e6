"""Every bench script runs end to end at a tiny shape (--tiny), so none can rot; the figures are not checked. The
round-robin timing they share (bench/rounds.py) is checked on its own, against figures worked out by hand."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench import rounds

ROOT = Path(__file__).resolve().parents[1]
REF = ROOT.parent / "shared" / "ref-data" / "hellaswag_val_preprocessed.jsonl"


def test_rounds_take_turns_after_an_untimed_warm_up(monkeypatch):
    """A B C A B C ...: every variant once a round, the warm-up round's calls untimed, each call's own seconds."""
    calls, clock = [], iter(range(100))
    monkeypatch.setattr(rounds.time, "perf_counter", lambda: float(next(clock)) ** 2)  # call k: (2k+1)^2 - (2k)^2
    variants = {name: (lambda name=name: calls.append(name) or len(calls)) for name in "ABC"}
    timed = rounds.time_rounds(variants, rounds=2, warmup=1)
    assert calls == list("ABCABCABC")
    assert timed.warmup == {"A": 1.0, "B": 5.0, "C": 9.0}
    assert timed.seconds == {"A": [13.0, 25.0], "B": [17.0, 29.0], "C": [21.0, 33.0]}
    assert timed.returns == {"A": [4, 7], "B": [5, 8], "C": [6, 9]} and timed.last == {"A": 7, "B": 8, "C": 9}
    assert timed.rate("A", 26.0) == [2.0, 26.0 / 25.0]
    with pytest.raises(ValueError):
        rounds.time_rounds(variants, rounds=0)


def test_ratios_are_per_round_and_summaries_median_and_range():
    a, b = [10.0, 30.0, 20.0, 12.0, 40.0], [5.0, 10.0, 10.0, 4.0, 20.0]
    assert rounds.ratios(a, b) == [2.0, 3.0, 2.0, 3.0, 2.0]  # not median(a) / median(b) = 20 / 10
    assert rounds.spread(a) == (20.0, 10.0, 40.0)
    assert rounds.fmt(rounds.ratios(a, b), ".2f", unit="x") == "2.00 (2.00-3.00)x"
    assert rounds.fmt([0.5, 0.25, 0.75], ".1f", 100, "%") == "50.0 (25.0-75.0)%"
    with pytest.raises(ValueError):
        rounds.ratios([1.0], [1.0, 2.0])
    # faster by more than the spread: ahead in every round, not only in the median
    assert rounds.beats([1.2, 1.1, 1.05]) and not rounds.beats([1.3, 1.2, 0.99])


def run_bench(script: str, *args: str) -> str:
    out = subprocess.run([sys.executable, str(ROOT / "bench" / script), *args], cwd=ROOT, capture_output=True,
                         text=True, timeout=900, env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


@pytest.mark.slow
def test_bench_train_tiny():
    out = run_bench("bench_train.py", "--tiny", "--profile")
    for row in ("matmul", "nanoGPT-style fp32 eager", "stage fp32", "stage default", "target: stage fp32",
                "head: plain", "decision: ", "median (min-max) over rounds"):
        assert row in out
    shares = re.search(r"profile, stage fp32, 3 steps .*: (.*)", out)
    assert shares and abs(sum(float(x) for x in re.findall(r"([\d.]+)%", shares.group(1))) - 100) < 0.5
    sweep = run_bench("bench_train.py", "--tiny", "--head-widths", "64", "96")
    assert re.search(r"n_embd +64: plain .* ms, \d+-row chunks .*x the plain path", sweep) and "n_embd    96" in sweep


@pytest.mark.slow
def test_bench_hellaswag_tiny():
    out = run_bench("bench_hellaswag.py", "--tiny", "--path", str(ROOT / "no-such-file.jsonl"), "--ref", str(REF))
    assert "synthetic" in out and "FLOP ceiling" in out and "float32" in out and "over 2 rounds" in out
    if REF.is_file():  # lm-eval's hf model beside gptcore's adapter on the same requests
        assert "lm-eval hf (HFLM)" in out and "gptcore adapter / hf" in out and "identical picks" in out
    else:
        assert "lm-eval peers: left out" in out


@pytest.mark.slow
def test_bench_gpu_tiny():
    out = run_bench("bench_gpu.py", "--tiny", "--parallel", "ddp", "fsdp")
    assert "gpt2_124m" in out and "modern_124m" in out and "expected from published figures" in out
    rows = [line.split() for line in out.splitlines() if line.startswith(("gpt2_124m ", "modern_124m "))]
    assert [(r[0], r[1]) for r in rows] == [(p, m) for p in ("gpt2_124m", "modern_124m") for m in ("ddp", "fsdp")]


@pytest.mark.slow
def test_bench_parallel_tiny():
    """ddp against fsdp at two gloo ranks: each mode's peak, estimate and step time, medians with their ranges."""
    out = run_bench("bench_parallel.py", "--tiny")
    assert "2 gloo ranks on the CPU" in out and "2 rounds" in out
    rows = {line.split()[0]: line for line in out.splitlines() if re.match(r"(ddp|fsdp) +\d", line)}
    assert set(rows) == {"ddp", "fsdp"} and all(re.search(r"\d+ \(\d+-\d+\)", r) for r in rows.values())
    assert re.search(r"fsdp / ddp: peak [\d.]+ \([\d.]+-[\d.]+\), step time", out)


@pytest.mark.slow
def test_bench_checkpoint_tiny():
    """Save and resume, with the digests and without, alternated: each a median with its range, and the cost."""
    out = run_bench("bench_checkpoint.py", "--tiny")
    assert "2 rounds, median (min-max) over rounds" in out and re.search(r"a checkpoint: [\d.]+ MB in \.metadata", out)
    for what in ("save", "resume"):
        assert re.search(rf"^{what} +with digests [\d.]+ \([\d.]+-[\d.]+\) s, without [\d.]+ \([\d.]+-[\d.]+\) s; "
                         rf"the digests cost [+-][\d.]+ \(.*\)%$", out, re.M), out


@pytest.mark.slow
def test_bench_tokenize_tiny():
    """The figures the lead reads are all there: stage against the ceiling, serial fraction, Amdahl's projection."""
    out = run_bench("bench_tokenize.py", "--tiny")
    lines = out.splitlines()
    header = next(line for line in lines if line.lstrip().startswith("encoder") and "serial" in line)
    assert all(col in header.split() for col in ("stage/ceil", "serial", "E16", "E64", "E128"))
    for encoder in ("tiktoken", "gigatoken"):
        summary = [line for line in lines
                   if line.lstrip().startswith(f"{encoder} ") and "of the parallel ceiling" in line]
        assert len(summary) == 1, out[-3000:]
        assert "serial fraction" in summary[0] and all(f"{n} cores" in summary[0] for n in (16, 64, 128))
        assert ")% of the parallel ceiling" in summary[0]  # a median with its range over rounds
    assert "median (min-max) over 2 rounds" in out


def test_bench_tokenize_help_says_how_to_run_it():
    out = run_bench("bench_tokenize.py", "--help")
    assert "quiet" in out and "--tiny" in out and "Amdahl" in out


def test_the_device_check_parses_and_runs_files_that_exist():
    """bench/device_check.sh runs only where a GPU is lent: here, its syntax and every file it names."""
    script = ROOT / "bench" / "device_check.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    named = re.findall(r"((?:bench|tests)/[\w/]+\.py)", script.read_text())
    assert "bench/bench_gpu.py" in named and all((ROOT / f).is_file() for f in named)


def test_doc_sentences_counts_and_splits_as_its_docstring_says(tmp_path):
    """bench/doc_sentences.py: code one word, a link its text, no split at e.g. or inside 0.25, tables, headings and
    code blocks left out, a list item its own block."""
    from bench import doc_sentences

    page = tmp_path / "page.md"
    page.write_text("# A heading. Not counted\n\n"
                    "One `two three` [four five](x.md) six. Seven (e.g. eight), 0.25 of `a`.\n"
                    "`Code` starts this one; a semicolon: a colon\n\n"
                    "| a. B | c |\n|---|---|\n\n```bash\nnot. Counted\n```\n"
                    "- **1. Item.** Two words on\n  two lines, et al. 2021 eval. not `an\nabbreviation`.\n",
                    encoding="utf-8")
    found = doc_sentences.page_sentences(page, tmp_path)
    assert [s.words for s in found] == [5, 6, 8, 1, 9, 2]
    assert [s.line for s in found] == [3, 3, 4, 12, 12, 13]
    assert doc_sentences.summary(found) == (6, 31 / 6, 9)
