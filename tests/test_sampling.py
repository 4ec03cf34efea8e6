"""gptcore-sample's prompt file: a mistake in it is one line naming the file, before any model is loaded."""
import pytest

from gptcore.errors import UserError
from gptcore.eval.sampling import main, read_prompt


def test_a_prompt_file_that_is_not_utf8_is_one_line_naming_it(tmp_path):
    path = tmp_path / "prompt.txt"
    path.write_bytes("ROMEO:\nBut soft, ".encode() + "caf\u00e9".encode("latin-1"))  # Latin-1, not UTF-8
    with pytest.raises(UserError, match=rf"^{path}: not UTF-8 \(byte 0xe9 at offset 20, line 2\)$"):
        read_prompt(f"FILE:{path}")
    with pytest.raises(SystemExit) as out:  # the CLI: refused before the (missing) model is looked at
        main(["--model", str(tmp_path / "no-such-model"), "--prompt", f"FILE:{path}"])
    assert out.value.code == f"[gptcore-sample] {path}: not UTF-8 (byte 0xe9 at offset 20, line 2)"


def test_a_utf8_prompt_file_is_read_as_text(tmp_path):
    path = tmp_path / "prompt.txt"
    path.write_text("红楼梦\n", encoding="utf-8")
    assert read_prompt(f"FILE:{path}") == "红楼梦\n"
    assert read_prompt("FILE") == "FILE"
