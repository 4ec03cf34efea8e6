"""The presets are listed by a command: `python -m gptcore.presets` prints every file of conf/preset/ with
the opening sentence of its comment (README's table is checked against the folder in tests/test_docs.py)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from gptcore import presets

ROOT = Path(__file__).resolve().parents[1]
PRESETS = sorted(p.stem for p in (ROOT / "conf" / "preset").glob("*.yaml"))


def test_every_preset_has_a_one_line_description():
    found = presets.preset_descriptions()
    assert sorted(found) == PRESETS and "modern_quickstart_tied" in found
    for name, about in found.items():
        assert about and about.endswith(".") and "\n" not in about and not about.startswith("@"), (name, about)
    for name, about in found.items():  # the opening comment's first sentence, its lines joined
        text = " ".join(line.lstrip("# ").strip() for line in (ROOT / "conf" / "preset" / f"{name}.yaml")
                        .read_text(encoding="utf-8").splitlines() if line.startswith("#"))
        assert about in text, (name, about)


def test_first_sentence_stops_only_at_a_full_stop_that_ends_a_sentence():
    first = presets._first_sentence
    assert first("Ratio 1.26 of (a.py. b) here. Next.") == "Ratio 1.26 of (a.py. b) here."
    assert first("No full stop") == "No full stop"
    assert first("") == ""


def test_a_preset_without_a_comment_is_listed_as_such(tmp_path):
    (tmp_path / "bare.yaml").write_text("# @package _global_\npreset: bare\n", encoding="utf-8")
    (tmp_path / "told.yaml").write_text("# @package _global_\n# Two lines of\n# text. More.\npreset: told\n",
                                        encoding="utf-8")
    assert presets.preset_descriptions(tmp_path) == {"bare": "", "told": "Two lines of text."}
    lines = presets.list_presets(tmp_path)
    assert lines[0].startswith("bare  (no description: ") and lines[1] == "told  Two lines of text."


def test_the_command_lists_every_preset_and_marks_the_default():
    out = subprocess.run([sys.executable, "-m", "gptcore.presets"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, check=True).stdout.splitlines()
    assert [line.split()[0] for line in out[:-1]] == PRESETS
    assert [re.match(r"quickstart \(default\) +The quick-start: ", line) is not None for line in out].count(True) == 1
    assert out[-1] == "run one: dvc exp run -S preset=<name>"
