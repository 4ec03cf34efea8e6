"""Every public class, function and method in gptcore/ and stages/ says in a line what it is (as nanoGPT's do)."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def public_definitions_without_docstring(path: Path, root: Path = ROOT) -> list[str]:
    """`file:line name` of each module-level or class-level public def/class lacking a docstring."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    missing = []

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if node.name.startswith("_"):
                    continue
                if ast.get_docstring(node) is None:
                    missing.append(f"{path.relative_to(root)}:{node.lineno} {prefix}{node.name}")
                if isinstance(node, ast.ClassDef):
                    visit(node.body, f"{prefix}{node.name}.")

    visit(tree.body, "")
    return missing


def test_every_public_definition_has_a_docstring():
    files = sorted((ROOT / "gptcore").rglob("*.py")) + sorted((ROOT / "stages").rglob("*.py"))
    assert len(files) > 20
    missing = [m for f in files for m in public_definitions_without_docstring(f)]
    assert not missing, f"{len(missing)} public definitions without a docstring:\n" + "\n".join(missing)


def test_the_walk_finds_what_it_should(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('def f():\n    pass\n\n\nclass C:\n    """A class."""\n\n    def m(self):\n        pass\n\n'
                     '    def _private(self):\n        pass\n\n\ndef g():\n    """Says."""\n', encoding="utf-8")
    assert public_definitions_without_docstring(probe, tmp_path) == ["probe.py:1 f", "probe.py:8 C.m"]
