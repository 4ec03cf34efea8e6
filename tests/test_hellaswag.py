"""HellaSwag data: download against a fake transport (checksum, truncation, offline), parsing, the real file."""
import hashlib
import json
import urllib.error
from collections import Counter
from pathlib import Path

import pytest
import torch
from reference_scorer import score_examples_reference

import gptcore.eval.tasks.hellaswag as hs
from gptcore.errors import UserError
from gptcore.eval.scorer import score_examples
from gptcore.eval.tasks.hellaswag import fetch_hellaswag, load_hellaswag, read_hellaswag
from gptcore.model.gpt import GPT, GPTConfig

REF = Path(__file__).resolve().parents[1] / ".." / "shared" / "ref-data" / "hellaswag_val_preprocessed.jsonl"

ITEM = {"ind": 24, "activity_label": "Roof shingle removal", "ctx": "A man is sitting on a roof. he",
        "endings": ["is using wrap to wrap a pair of skis.", "is ripping level tiles off.",
                    "is holding a rubik's cube.", "starts pulling up roofing on a roof."],
        "label": 3, "split": "val"}
CONTENT = "".join(json.dumps({**ITEM, "ind": i, "label": i % 4}) + "\n" for i in range(50)).encode()


class CharCodes:
    """A stand-in tokenizer: one id per character."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]


@pytest.fixture
def official(monkeypatch):
    """Pretend CONTENT is the official file (its size and sha256 become the expected ones)."""
    monkeypatch.setattr(hs, "HELLASWAG_VAL_SIZE", len(CONTENT))
    monkeypatch.setattr(hs, "HELLASWAG_VAL_SHA256", hashlib.sha256(CONTENT).hexdigest())


def chunks(data: bytes, size: int = 100):
    return lambda url: (data[i:i + size] for i in range(0, len(data), size))


def test_download_verifies_renames_and_caches(tmp_path, official):
    calls = []

    def transport(url):
        calls.append(url)
        return chunks(CONTENT)(url)

    path = fetch_hellaswag(tmp_path / "hs", transport=transport, progress=False)
    assert path == tmp_path / "hs" / "hellaswag_val.jsonl" and path.read_bytes() == CONTENT
    assert calls == [hs.HELLASWAG_VAL_URL]
    assert fetch_hellaswag(tmp_path / "hs", transport=transport, progress=False) == path
    assert len(calls) == 1  # verified cache, no second download
    path.write_bytes(CONTENT[:-1] + b"x")  # a damaged cache is downloaded again
    fetch_hellaswag(tmp_path / "hs", transport=transport, progress=False)
    assert len(calls) == 2 and path.read_bytes() == CONTENT


def test_checksum_mismatch_is_a_clear_error_and_leaves_no_file(tmp_path, official):
    corrupt = CONTENT.replace(b"roof", b"ROOF")
    assert len(corrupt) == len(CONTENT)
    with pytest.raises(UserError, match=f"sha256 .* does not match the expected {hs.HELLASWAG_VAL_SHA256}"):
        fetch_hellaswag(tmp_path / "hs", transport=chunks(corrupt), progress=False)
    assert list((tmp_path / "hs").iterdir()) == []


def test_truncated_download_is_a_clear_error_and_leaves_no_file(tmp_path, official):
    with pytest.raises(UserError, match=f"download truncated, got 1,000 of {len(CONTENT):,} bytes"):
        fetch_hellaswag(tmp_path / "hs", transport=chunks(CONTENT[:1000]), progress=False)
    assert list((tmp_path / "hs").iterdir()) == []


def test_offline_error_says_which_file_to_place_where(tmp_path):
    def offline(url):
        yield b'{"ind": 0'  # a partial first chunk, then the connection drops
        raise urllib.error.URLError("Name or service not known")

    dest = tmp_path / "hs" / "hellaswag_val.jsonl"
    with pytest.raises(UserError) as err:
        fetch_hellaswag(tmp_path / "hs", transport=offline, progress=False)
    msg = str(err.value)
    assert "hellaswag_val.jsonl" in msg and str(dest) in msg and hs.HELLASWAG_VAL_SHA256 in msg
    assert "eval.hellaswag_path" in msg and "12,246,618 bytes" in msg
    assert list((tmp_path / "hs").iterdir()) == []


def test_local_copy_is_used_as_is(tmp_path):
    local = tmp_path / "my_copy.jsonl"
    local.write_bytes(CONTENT)
    assert fetch_hellaswag(tmp_path / "unused", path=local, transport=chunks(b"")) == local
    with pytest.raises(UserError, match="eval.hellaswag_path=.*nope.jsonl: no such file"):
        fetch_hellaswag(tmp_path / "unused", path=tmp_path / "nope.jsonl")


def test_rendering_is_context_then_space_prefixed_endings(tmp_path):
    path = tmp_path / "val.jsonl"
    path.write_bytes(CONTENT)
    examples = load_hellaswag(path, CharCodes(), limit=3)
    assert [e.index for e in examples] == [0, 1, 2] and [e.label for e in examples] == [0, 1, 2]
    assert examples[0].context == [ord(c) for c in ITEM["ctx"]]
    assert examples[0].endings[3] == [ord(c) for c in " " + ITEM["endings"][3]]


@pytest.mark.parametrize("line, problem", [
    ('{"ctx": "a", "endings": ["b", "c", "d", "e"], "label": 1', "not valid JSON"),
    ('{"ctx": "a", "endings": ["b", "c", "d"], "label": 1}', "'endings' must be a list of 4 strings"),
    ('{"ctx": "a", "endings": ["b", "c", "d", "e"], "label": 4}', "label 4 is not in 0..3"),
    ('{"ctx": "a", "endings": ["b", "c", "d", "e"], "label": "x"}', "label 'x' is not an integer"),
    ('{"endings": ["b", "c", "d", "e"], "label": 1}', "missing field 'ctx'"),
    ('{"ctx": "a", "label": 1}', "missing field 'endings'"),
    ('{"ctx": "a", "endings": ["b", "c", "d", "e"]}', "missing field 'label'"),
    ('{"ctx": "a", "endings": ["b", "c", "d", "e", "f"], "label": 1}',
     r"'endings' must be a list of 4 strings \(got 5"),
    ('{"ctx": "a", "endings": "bcde", "label": 1}', "'endings' must be a list of 4 strings"),
    ('{"ctx": "a", "endings": ["b", "c", "d", "e"], "label": true}', "label True is not an integer"),
    ('{"ctx": "a", "endings": ["b", "c", "d", "e"], "label": 1.5}', "label 1.5 is not an integer"),
    ('{"ctx": "a", "endings": ["b", "c", "d", "e"], "label": -1}', "label -1 is not in 0..3"),
    ('{"ind": "x7", "ctx": "a", "endings": ["b", "c", "d", "e"], "label": 1}', "ind 'x7' is not an integer"),
    ('{"ind": 2.5, "ctx": "a", "endings": ["b", "c", "d", "e"], "label": 1}', "ind 2.5 is not an integer"),
    ('{"ind": null, "ctx": "a", "endings": ["b", "c", "d", "e"], "label": 1}', "ind None is not an integer"),
    ('{"ctx": 3, "endings": ["b", "c", "d", "e"], "label": 1}', "'ctx' is int, not a string"),
    ('["a", ["b", "c", "d", "e"], 1]', "a JSON list, expected an object"),
    (b'{"ctx": "caf\xe9", "endings": ["b", "c", "d", "e"], "label": 1}', "not UTF-8 \\(byte 0xe9 at column 13\\)"),
])
def test_bad_lines_name_the_file_and_line(tmp_path, line, problem):
    path = tmp_path / "val.jsonl"
    line = line if isinstance(line, bytes) else line.encode()
    path.write_bytes(json.dumps(ITEM).encode() + b"\n" + line + b"\n" + json.dumps(ITEM).encode() + b"\n")
    with pytest.raises(UserError, match=f"val.jsonl:2: {problem}"):
        read_hellaswag(path)


def test_a_bad_line_is_found_past_good_ones_and_a_string_label_is_accepted(tmp_path):
    """Some copies store the label as a string of digits: accepted; line numbers count blank lines too."""
    path = tmp_path / "val.jsonl"
    good = dict(ITEM, label="2", ind=7)
    path.write_text(json.dumps(good) + "\n\n" + json.dumps(ITEM) + "\n" + "{oops\n")
    with pytest.raises(UserError, match="val.jsonl:4: not valid JSON"):
        read_hellaswag(path)
    items = read_hellaswag(path, limit=2)
    assert [(it["ind"], it["label"]) for it in items] == [(7, 2), (ITEM["ind"], ITEM["label"])]


def test_missing_file_says_where_to_place_it(tmp_path):
    with pytest.raises(UserError, match="HellaSwag file not found.*eval.hellaswag_path"):
        read_hellaswag(tmp_path / "hellaswag_val.jsonl")


@pytest.mark.parametrize("content", ["", "\n  \n\n"], ids=["empty", "blank_lines"])
def test_a_file_without_examples_is_refused_naming_it(tmp_path, content):
    """Zero examples would score acc 0.0 over count 0: no metric is ever written from zero examples."""
    path = tmp_path / "hellaswag_val.jsonl"
    path.write_text(content)
    with pytest.raises(UserError, match=f"{path}: no HellaSwag examples in the file"):
        load_hellaswag(path, CharCodes())


def test_no_accuracy_of_zero_examples():
    model = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=8, vocab_size=16))
    with pytest.raises(ValueError, match="over zero examples is undefined"):
        score_examples(model, [], 16, device="cpu", progress=False)


@pytest.fixture(scope="module")
def ref_examples():
    if not REF.is_file():
        pytest.skip(f"reference data absent: {REF} (a clone without ../shared/ref-data)")
    from gptcore.data.tokenizers import get_tokenizer

    return load_hellaswag(REF, get_tokenizer("gpt2"))


def test_reference_file_parses_whole(ref_examples):
    assert len(ref_examples) == hs.HELLASWAG_VAL_EXAMPLES == 10_042
    assert Counter(e.label for e in ref_examples) == {0: 2515, 1: 2485, 2: 2584, 3: 2458}
    assert [e.index for e in ref_examples] == list(range(10_042))
    assert all(len(e.endings) == 4 and e.context and all(e.endings) for e in ref_examples)
    first = json.loads(REF.open().readline())
    from gptcore.data.tokenizers import get_tokenizer

    tok = get_tokenizer("gpt2")
    assert tok.decode(ref_examples[0].context) == first["ctx"]
    assert [tok.decode(e) for e in ref_examples[0].endings] == [" " + e for e in first["endings"]]


@pytest.mark.slow
def test_reference_file_scores_on_a_small_random_gpt(ref_examples):
    torch.manual_seed(0)
    # block 96 < the longest rendered row (about 150 tokens): real contexts get cut
    model = GPT(GPTConfig(block_size=96, vocab_size=50304, n_layer=2, n_head=2, n_embd=32)).eval()
    subset = sorted(ref_examples, key=lambda e: -len(e.context))[:8] + ref_examples[:16]
    assert max(len(e.context) + max(map(len, e.endings)) for e in subset) > 96
    ref = score_examples_reference(model, subset, 50257)
    fast = score_examples(model, subset, 50257, device="cpu", batch_size=8, progress=False)
    assert ref.count == 24
    assert (fast.count, fast.correct, fast.correct_norm) == (ref.count, ref.correct, ref.correct_norm)
    for p, q in zip(ref.predictions, fast.predictions):
        assert (q["index"], q["pred"], q["pred_norm"]) == (p["index"], p["pred"], p["pred_norm"])
        assert q["mean_losses"] == pytest.approx(p["mean_losses"], rel=1e-5)


# a row that cannot be scored is found when the file is read, named by its file and line

@pytest.mark.parametrize("row, why", [
    ({**ITEM, "ind": 3, "ctx": ""}, "empty context"),
    ({**ITEM, "ind": 3, "endings": ["x" * 80, "b", "c", "d"]}, "an ending of 81 tokens does not fit block_size 64"),
])
def test_a_row_that_cannot_be_scored_is_refused_at_load_naming_file_and_line(tmp_path, row, why):
    path = tmp_path / "val.jsonl"
    rows = [json.dumps({**ITEM, "ind": 1}), "", json.dumps({**ITEM, "ind": 2}), json.dumps(row)]
    path.write_text("\n".join(rows) + "\n")
    with pytest.raises(UserError, match=f"^{path}:4: {why}"):
        hs.hellaswag_examples(CharCodes(), path, None, "eval.hellaswag_path", block_size=64, progress=False)
    assert len(load_hellaswag(path, CharCodes(), limit=2, block_size=64)) == 2  # the rows before it are fine


def test_examples_name_their_file_and_line(tmp_path):
    path = tmp_path / "val.jsonl"
    path.write_text("\n" + json.dumps(ITEM) + "\n")
    (ex,) = load_hellaswag(path, CharCodes())
    assert ex.where == f"{path}:2" and ex.index == ITEM["ind"]


def test_hellaswag_file_records_the_sha256_of_the_file_read(tmp_path, official):
    path = tmp_path / "copy.jsonl"
    path.write_bytes(CONTENT)
    assert hs.hellaswag_file(path) == {"file": str(path), "sha256": hashlib.sha256(CONTENT).hexdigest()}
    # null: the verified download in the cache folder
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / hs.HELLASWAG_VAL_NAME).write_bytes(CONTENT)
    assert hs.hellaswag_file(None, tmp_path / "cache")["sha256"] == hs.HELLASWAG_VAL_SHA256
