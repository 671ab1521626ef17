"""The shape of the suite itself. No module under tests/ or bench/ imports a test module:
what several modules share lives in conftest.py or a helper module (tests/*.py not named
test_*, tests/fakes/), so editing, moving or deleting one test module never breaks another
(nor collects its tests twice under another name)."""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

# Until tests/fakes/agents.py (issue 22's one fake AgentService, made in the redesign
# branch) replaces test_runs.Parked. Not required to be present, so that merging that
# branch does not fail this test; delete the entry then.
KNOWN: set[tuple[str, str]] = set()


def imported_test_modules(path: Path) -> set[str]:
    """The test modules (test_*) that `path` imports, by module name."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            parts = (node.module or "").split(".")
            names.update(p for p in parts if p.startswith("test_"))
            names.update(a.name for a in node.names if a.name.startswith("test_"))
        elif isinstance(node, ast.Import):
            names.update(p for a in node.names for p in a.name.split(".") if p.startswith("test_"))
    return names


def python_files(top: Path) -> Iterator[Path]:
    """The .py files under `top`, never descending into installed tools (tests/.tools holds
    the CLIs' node_modules: walking it would cost seconds)."""
    for root, dirs, files in os.walk(top):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("node_modules", "__pycache__")]
        yield from (Path(root) / f for f in files if f.endswith(".py"))


def test_no_module_under_tests_or_bench_imports_a_test_module() -> None:
    found = {(str(p.relative_to(ROOT)), name)
             for top in (TESTS, ROOT / "bench") for p in python_files(top)
             for name in imported_test_modules(p)}
    assert found - KNOWN == set(), "move what they share into conftest.py or a helper module"


def test_the_rule_sees_every_form_of_import(tmp_path: Path) -> None:
    forms = ["from .test_a import x", "from tests.test_b import y", "from . import test_c",
             "import tests.test_d", "from .helpers import z", "import test_e as e"]
    probe = tmp_path / "probe.py"
    probe.write_text("\n".join(forms) + "\n")
    assert imported_test_modules(probe) == {"test_a", "test_b", "test_c", "test_d", "test_e"}
