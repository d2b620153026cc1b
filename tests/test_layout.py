"""Where modules live: the production packages hold neither test doubles nor demo code, and never
import from tests/ or scripts/ (the stage layer redesign, "Modules go where they belong")."""

import ast
import re
import subprocess
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


# a clone holds nothing beside the repository: a path or a document outside it cannot be followed
# spelt in pieces so that this file, which must name them, does not itself hold a reference
OUTSIDE_REFS = ("../" + "shared", "DESIGN" + ".md", "STYLE" + ".md")


# a comment gives the reason, not the ticket: tracker numbers mean nothing to a reader of the code
TICKET_RE = re.compile(r"\b[Ii]ssue (?:#?\d+|:)")


def outside_references(root: Path) -> list[str]:
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=root, capture_output=True, text=True, check=True
    ).stdout.split()
    bad = []
    for rel in files:
        p = root / rel
        if (
            p.suffix not in (".py", ".md", ".yaml", ".yml", ".sh", ".toml", ".cfg", ".txt", "")
            or not p.is_file()
        ):
            continue
        text = p.read_text(errors="replace")
        bad += [f"{rel}: {ref}" for ref in OUTSIDE_REFS if ref in text]
        bad += [f"{rel}: {m.group(0)}" for m in TICKET_RE.finditer(text)]
    return bad


def test_nothing_points_outside_the_repository():
    assert not outside_references(REPO_ROOT)


def test_outside_reference_check_catches_one(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    design, shared, ticket = OUTSIDE_REFS[1], OUTSIDE_REFS[0], "issue" + " 18"
    (tmp_path / "a.py").write_text(f'"""see {design} section 1"""\n')
    (tmp_path / "b.yaml").write_text(f"path: {shared}/data/x.json  # as {ticket} asks\n")
    assert outside_references(tmp_path) == [f"a.py: {design}", f"b.yaml: {shared}", f"b.yaml: {ticket}"]
