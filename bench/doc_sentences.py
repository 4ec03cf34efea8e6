"""Sentence length in the prose of README.md and docs/*.md: per file and over all of them, the number of sentences,
the mean words a sentence (all words over all sentences) and the longest sentence.

What counts as prose: every line except fenced code blocks (``` or ~~~, indented ones included), table rows (lines
that start with `|`), headings (lines that start with `#`), image lines (`![alt](src)` alone on a line) and HTML
comments. A leading `>` (a quote) is dropped.

Words: inline `code` counts as one word, whatever it holds (a code span may go on over a line break); a
[link](url) counts as the words of its text; `*` outside code (emphasis marks) is dropped. A word is then a
whitespace-separated token holding at least one letter or digit, or inline code (so `-`, `±`, `→` and `=` standing
alone are not words).

The sentence-splitting rule:
1. Blocks. The prose splits into blocks at blank lines, at the lines left out above and at each list item (a line
   that starts with `-`, `*`, `+` or `N.`, indented or not); a line that follows without a blank line joins its
   block. The end of a block always ends a sentence. A list marker at the start of a block (`- `, `1. `, also
   inside bold, as `**1. The bracket.**`) is not a word.
2. Full stops. Inside a block a sentence ends at `.`, `!` or `?` followed by whitespace (closing brackets, quotes
   or emphasis marks may come between), whatever follows: these pages start many sentences with a lower-case
   name (`compare writes ...`, `bf16 rounds ...`). The CJK full stop `。` always ends one.
3. Not full stops: the `.` of `e.g.`, `i.e.`, `cf.`, `vs.`, `etc.`, `approx.` and `et al.`, and an ellipsis (`...`,
   `…`). A `.` with no whitespace after it (`0.25`, `gptcore.config`, `...,`) never ends a sentence. Colons and
   semicolons never end one.

    python bench/doc_sentences.py                  # the table: README.md, docs/*.md, all
    python bench/doc_sentences.py --longest 20     # and the 20 longest sentences, with file and line
    python bench/doc_sentences.py --over 30        # and every sentence of more than 30 words
    python bench/doc_sentences.py --root ../other  # the pages of another checkout (a before/after table)
"""
from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^\s*(```|~~~)")
LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+\.)\s+")
LEAD_MARKER = re.compile(r"^\s*(?:[-+]\s+)?(?:\d+\.\s+)?")  # after plain(), which drops `*`
IMAGE_LINE = re.compile(r"^\s*!\[[^\]]*\]\([^)]*\)\s*$")
CODE = re.compile(r"`+[^`]+?`+")
LINK = re.compile(r"!?\[([^\]]*)\]\([^)\s]*\)")
ABBREVIATIONS = ("e.g.", "i.e.", "cf.", "vs.", "etc.", "approx.", "al.", "...", "…")
SENTENCE_END = re.compile(r"(?:[.!?][)\]\"'”’]*)(?=\s+\S)|。")
WORD = re.compile(r"\w")


@dataclass(frozen=True)
class Sentence:
    path: str
    line: int
    words: int
    text: str


def prose_blocks(text: str) -> list[list[tuple[int, str]]]:
    """The prose of one page as blocks of (line number, line), per rule 1 of the module's docstring."""
    blocks: list[list[tuple[int, str]]] = []
    current: list[tuple[int, str]] = []
    in_fence, in_comment = False, False

    def close() -> None:
        nonlocal current
        if current:
            blocks.append(current)
        current = []

    for number, line in enumerate(text.split("\n"), start=1):
        if in_fence:
            if FENCE.match(line):
                in_fence = False
            continue
        if in_comment:
            in_comment = "-->" not in line
            continue
        if FENCE.match(line):
            close()
            in_fence = True
            continue
        if line.lstrip().startswith("<!--"):
            close()
            in_comment = "-->" not in line
            continue
        stripped = line.strip()
        if stripped.startswith(">"):
            stripped = stripped.lstrip("> ").strip()
        if not stripped or stripped.startswith("|") or stripped.startswith("#") or IMAGE_LINE.match(stripped):
            close()
            continue
        if LIST_ITEM.match(line):
            close()
        current.append((number, stripped))
    close()
    return blocks


def plain(text: str) -> str:
    """Inline code as one word (a run of \\x00), links as their text, emphasis marks dropped; every character keeps
    its position, so that a sentence can be traced to its line."""
    text = CODE.sub(lambda m: "\x00" * len(m.group()), text)
    text = LINK.sub(lambda m: " " + m.group(1) + " " * (len(m.group()) - len(m.group(1)) - 1), text)
    return text.replace("*", " ")


def count_words(text: str) -> int:
    return sum(1 for token in text.split() if "\x00" in token or WORD.search(token))


def sentences_of(block: list[tuple[int, str]], path: str) -> list[Sentence]:
    """Rules 2 and 3: split one block into sentences."""
    starts, joined = [], ""
    for number, line in block:
        starts.append((len(joined), number))
        joined += line + " "
    joined = plain(joined)  # after joining: a code span may go on over a line break
    joined = LEAD_MARKER.sub(lambda m: " " * len(m.group()), joined, count=1)  # positions kept for line_at

    def line_at(position: int) -> int:
        return max(number for start, number in starts if start <= position)

    out, begin = [], 0
    for m in SENTENCE_END.finditer(joined):
        piece = joined[begin:m.end()]
        last = piece.split()[-1].lower().rstrip(")]\"'”’").lstrip("([\"'“‘") if piece.split() else ""
        if m.group() != "。" and (last in ABBREVIATIONS or last.endswith(("...", "…"))):
            continue
        out.append((begin, piece))
        begin = m.end()
    out.append((begin, joined[begin:]))
    result = []
    for position, piece in out:
        n = count_words(piece)
        if n:
            lead = len(piece) - len(piece.lstrip())
            text = " ".join(re.sub("\x00+", "`…`", piece).split())
            result.append(Sentence(path, line_at(position + lead), n, text))
    return result


def page_sentences(path: Path, root: Path = ROOT) -> list[Sentence]:
    """Every sentence of one page's prose."""
    name = path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)
    return [s for block in prose_blocks(path.read_text(encoding="utf-8")) for s in sentences_of(block, name)]


def pages(root: Path = ROOT) -> list[Path]:
    """README.md, then docs/*.md in name order."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def summary(found: list[Sentence]) -> tuple[int, float, int]:
    """(sentences, mean words a sentence, most words in one)."""
    if not found:
        return 0, 0.0, 0
    return len(found), sum(s.words for s in found) / len(found), max(s.words for s in found)


def table(per_page: dict[str, list[Sentence]]) -> list[str]:
    """The figures, one line per page and one for all of them."""
    width = max(len(name) for name in [*per_page, "all"])
    lines = [f"{'file':<{width}}  {'sentences':>9}  {'mean':>5}  {'max':>4}"]
    for name, found in [*per_page.items(), ("all", [s for f in per_page.values() for s in f])]:
        n, mean, most = summary(found)
        lines.append(f"{name:<{width}}  {n:>9}  {mean:>5.1f}  {most:>4}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="*", type=Path, help="pages to measure (default: README.md and docs/*.md)")
    parser.add_argument("--root", type=Path, default=ROOT, help="measure README.md and docs/*.md under this folder")
    parser.add_argument("--longest", type=int, default=0, metavar="N", help="also print the N longest sentences")
    parser.add_argument("--over", type=int, default=0, metavar="W", help="also print every sentence over W words")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    files = [p.resolve() for p in args.files] or pages(root)
    per_page = {}
    for path in files:
        found = page_sentences(path, root)
        per_page[found[0].path if found else path.name] = found
    print("\n".join(table(per_page)))
    every = [s for f in per_page.values() for s in f]
    shown = sorted(every, key=lambda s: -s.words)[:args.longest] if args.longest else []
    shown += [s for s in every if args.over and s.words > args.over and s not in shown]
    for s in shown:
        print(f"\n{s.path}:{s.line}: {s.words} words\n  {s.text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
