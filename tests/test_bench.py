"""Every bench script runs end to end at a tiny shape (--tiny), so none can rot; the figures are not checked. The
round-robin timing they share (bench/rounds.py) is checked on its own, against figures worked out by hand."""
import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench import bench_memory, bench_train, rounds

ROOT = Path(__file__).resolve().parents[1]
REF = ROOT.parent / "shared" / "ref-data" / "hellaswag_val_preprocessed.jsonl"
SAMPLE_DOCS = ROOT.parent / "shared" / "ref-data" / "fineweb_edu_sample.jsonl"


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


@pytest.fixture(scope="module")
def fineweb_sample(tmp_path_factory) -> SimpleNamespace:
    """first_hour.py --make-sample of the FineWeb-Edu sample (the device check's tokens): the tokens' file and what
    the script said."""
    if not SAMPLE_DOCS.is_file():
        pytest.skip(f"{SAMPLE_DOCS} is not here")
    path = tmp_path_factory.mktemp("fineweb") / "sample.npy"
    return SimpleNamespace(path=path, said=run_bench("first_hour.py", "--make-sample", str(SAMPLE_DOCS), "--sample",
                                                     str(path)))


@pytest.mark.slow
def test_bench_train_tiny(capsys):
    out = run_bench("bench_train.py", "--tiny", "--profile")
    for row in ("matmul", "nanoGPT-style fp32 eager", "stage fp32", "stage default", "target: stage fp32",
                "head: plain", "decision: ", "median (min-max) over rounds"):
        assert row in out
    shares = re.search(r"profile, stage fp32, 3 steps .*: (.*)", out)
    assert shares and abs(sum(float(x) for x in re.findall(r"([\d.]+)%", shares.group(1))) - 100) < 0.5
    # the sweep's own path of the same script, in this process (the script's start is checked above)
    capsys.readouterr()
    bench_train.main(["--tiny", "--head-widths", "64", "96"])
    sweep = capsys.readouterr().out
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
    """ddp, fsdp and hsdp at 4 gloo ranks as 2 nodes of 2: each mode's peak, estimate and step time, medians with
    their ranges, and each against ddp."""
    out = run_bench("bench_parallel.py", "--tiny")
    assert "4 gloo ranks on the CPU as 2 nodes of 2" in out and "2 rounds" in out
    rows = {line.split()[0]: line for line in out.splitlines() if re.match(r"(ddp|fsdp|hsdp) +\d", line)}
    assert set(rows) == {"ddp", "fsdp", "hsdp"} and all(re.search(r"\d+ \(\d+-\d+\)", r) for r in rows.values())
    for mode in ("fsdp", "hsdp"):
        assert re.search(rf"{mode} / ddp: peak [\d.]+ \([\d.]+-[\d.]+\), step time", out)


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


def test_the_device_check_fits_its_window_starts_with_the_preflight_and_runs_files_that_exist():
    """bench/device_check.sh runs only where a GPU is lent: here, its syntax, every file it names, and its steps' time
    limits: the preflight at 10 s before any other step but the wheels', and all of them under the 480 s the check
    may take."""
    script = ROOT / "bench" / "device_check.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    text = script.read_text()
    named = re.findall(r"((?:bench|tests)/[\w/]+\.py)", text)
    assert {"bench/bench_gpu.py", "bench/preflight.py", "bench/first_hour.py"} <= set(named)
    assert all((ROOT / f).is_file() for f in named)
    limits = {k: int(v) for k, v in re.findall(r"\blimit_(\w+)=(\d+)", text.split("if [ -n \"${DRY:-}\" ]")[0])}
    assert limits["preflight"] == 10 and sum(limits.values()) < 480, limits
    used = re.findall(r'step "[^"]+" "\$limit_(\w+)"', text)
    assert sorted(used) == sorted(limits) and used.index("preflight") <= 1, used
    assert subprocess.run(["bash", "-n", str(ROOT / "bench" / "device_wheels.sh")]).returncode == 0


@pytest.mark.slow
def test_the_device_check_dry_run_writes_one_summary_of_every_step(tmp_path, fineweb_sample):
    """DRY=1: every step at tiny sizes on the CPU, each under its heading in the one summary file, with its exit
    status: the preflight passes, the GPU query fails here, the bench prints its rows, the CUDA tests skip, the first
    hour's short run trains from the FineWeb-Edu sample and compares nothing (the only run of first_hour.py --run)."""
    env = {**os.environ, "DRY": "1", "OUT": str(tmp_path / "out"), "SAMPLE": str(fineweb_sample.path),
           "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(["bash", str(ROOT / "bench" / "device_check.sh")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900)
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert done.stdout == summary and summary.startswith("# Device check, ")
    for title, status in (("preflight: every import", "exit 0"), ("GPU", "exit 127"),
                          ("bench: tokens/s, MFU, peak memory", "exit 0"), ("CUDA tests", "exit 0"),
                          ("first GPU hour", "exit 0")):
        assert re.search(rf"^{re.escape(title)}.*: {status}, \d+ s of \d+$", summary, re.M), (title, summary[-3000:])
    assert "preflight: every import found" in summary and "gpt2_350m    fsdp" in summary
    assert re.search(r"\d+ skipped", summary)
    # the first hour's short run at a tiny shape, from the FineWeb-Edu sample tokenized here (the sample's own line)
    assert re.search(r"[\d,]+ GPT-2 tokens of", fineweb_sample.said)
    hour = summary.split("\n## first GPU hour", 1)[1].split("\nfirst GPU hour", 1)[0]
    assert "from the FineWeb-Edu sample" in hour and "step 2: train loss" in hour, hour
    assert "first hour: nothing compared here" in hour


def test_bench_gpu_rows_name_preset_mode_and_compile():
    from bench import bench_gpu

    args = bench_gpu.argparse.Namespace(rows=["gpt2_124m:ddp", "gpt2_350m:fsdp:eager", "a:ddp:compile"])
    assert bench_gpu.row_specs(args) == [("gpt2_124m", "ddp", None), ("gpt2_350m", "fsdp", False), ("a", "ddp", True)]
    args = bench_gpu.argparse.Namespace(rows=None, presets=["p", "q"], parallel=["ddp", "fsdp"])
    assert bench_gpu.row_specs(args) == [("p", "ddp", None), ("p", "fsdp", None), ("q", "ddp", None),
                                         ("q", "fsdp", None)]
    for bad in ("gpt2_124m", "gpt2_124m:zero", "gpt2_124m:ddp:fast"):
        with pytest.raises(SystemExit, match="expected PRESET:MODE"):
            bench_gpu.row_specs(bench_gpu.argparse.Namespace(rows=[bad]))


def write_run_metrics(folder: Path, val_250: float, tokens_per_sec: float) -> Path:
    """A finished first-hour run's step metrics as dvclive writes them (step TSVs)."""
    tsv = folder / "plots" / "metrics"
    tsv.mkdir(parents=True)
    (tsv / "train_loss.tsv").write_text("step\ttrain_loss\n" + "".join(
        f"{s}\t{10.99 - 4.8 * s / 249:.4f}\n" for s in range(250)))
    (tsv / "val_loss.tsv").write_text(f"step\tval_loss\n0\t10.9900\n250\t{val_250}\n")
    (tsv / "tokens_per_sec.tsv").write_text("step\ttokens_per_sec\n" + "".join(
        f"{s}\t{tokens_per_sec if s else 1000.0}\n" for s in range(250)))
    return folder


def test_the_first_hour_check_passes_the_published_run_and_fails_a_broken_one(tmp_path):
    """bench/first_hour.py --check against figures written here: build-nanogpt's 6.1631 at step 250 passes, its
    broken-sync run's 6.4300 fails; on an H100 (989 TFLOP/s) 400,000 tokens/s passes and 200,000 fails (half of
    build-nanogpt's MFU there is about 297,000)."""
    h100 = ["--gpu", "NVIDIA H100 80GB HBM3"]
    good = run_bench("first_hour.py", "--check", str(write_run_metrics(tmp_path / "a", 6.17, 4e5)), *h100)
    assert "first hour: pass (3 of 3 compared figures pass)" in good
    assert re.search(r"val loss, step 250 +6.1631 +6.1700 +PASS", good)
    for folder, val, speed, failing in ((tmp_path / "b", 6.43, 4e5, "val loss, step 250"),
                                        (tmp_path / "c", 6.17, 2e5, "tokens/s (MFU)")):
        out = subprocess.run([sys.executable, str(ROOT / "bench" / "first_hour.py"), "--check",
                              str(write_run_metrics(folder, val, speed)), *h100], capture_output=True, text=True)
        assert out.returncode == 1 and "first hour: FAIL (2 of 3" in out.stdout, out.stdout + out.stderr
        assert re.search(rf"{re.escape(failing)} .* FAIL ", out.stdout), out.stdout


@pytest.mark.slow
def test_bench_memory_tiny():
    """The saved-for-backward table (measured beside the formula, equal), the peaks at 2 gloo ranks, the tables."""
    out = run_bench("bench_memory.py", "--tiny")
    saved = [r for r in (line.split() for line in out.splitlines())
             if len(r) == 6 and r[0] in bench_memory.RECIPES and r[1] in ("float32", "bfloat16")]
    assert len(saved) == 2 * len(bench_memory.RECIPES) and all(float(r[3]) == float(r[5]) for r in saved), saved
    assert len(re.findall(r"^2 x 64, .* (ddp|fsdp) ", out, re.M)) == 4
    assert re.search(r"^gpt2_1558m +4 +[\d.]+ +[\d.]+ ", out, re.M)


@pytest.mark.slow
def test_the_preflight_passes_with_only_its_imports_and_names_one_taken_away(tmp_path):
    """An environment holding only bench/preflight.py's distributions and what they require (this machine's installs,
    linked into one folder; python -S: no site-packages) runs every step's imports; without psutil the preflight
    names it and stops."""
    from bench import preflight

    site = tmp_path / "site"
    site.mkdir()
    dists = [line.split("==")[0] for line in preflight.closure(list(preflight.IMPORTS.values()), set())]
    for dist in dists:
        for top in {Path(str(f)).parts[0] for f in importlib.metadata.files(dist) or []}:
            src = Path(importlib.metadata.distribution(dist).locate_file(top))
            if src.exists() and not (site / top).exists() and top not in ("..", "bin"):
                (site / top).symlink_to(src)

    def preflight_there() -> subprocess.CompletedProcess:
        code = (f"import sys, runpy; sys.path[:0] = [{str(site)!r}]; sys.argv = ['preflight']; "
                f"runpy.run_path({str(ROOT / 'bench' / 'preflight.py')!r}, run_name='__main__')")
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        return subprocess.run([sys.executable, "-S", "-c", code], cwd=tmp_path, env=env, capture_output=True,
                               text=True, timeout=300)

    ok = preflight_there()
    assert ok.returncode == 0 and "preflight: every import found" in ok.stdout, ok.stdout + ok.stderr
    for entry in site.iterdir():
        if entry.name == "psutil" or entry.name.startswith("psutil-"):
            entry.unlink()
    gone = preflight_there()
    assert gone.returncode == 1 and "psutil (pip: psutil): No module named 'psutil'" in gone.stdout, gone.stdout


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
