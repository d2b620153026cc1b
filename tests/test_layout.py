"""Where modules live: the production packages hold neither test doubles nor demo code, and never
import from tests/ or scripts/ (the stage layer redesign, "Modules go where they belong")."""

import ast
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["hymem_train", "harnesses", "reward", "data_pipeline"]


@pytest.mark.parametrize("package", PACKAGES)
def test_packages_do_not_import_tests_or_scripts(package):
    bad = []
    for path in sorted((REPO_ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            bad += [
                f"{path.relative_to(REPO_ROOT)}: {n}"
                for n in names
                if n.split(".")[0] in ("tests", "scripts")
            ]
    assert not bad, bad


@pytest.mark.parametrize("package", PACKAGES)
def test_no_test_doubles_or_demo_in_packages(package):
    root = REPO_ROOT / package
    assert not list(root.rglob("testing.py")), "test doubles go under tests/doubles/"
    assert not list(root.glob("demo*.py")), "demo code goes under scripts/demo_lib/"
