"""The mutation table of scripts/mutations.py does not rot: every original snippet still occurs exactly
once in its file, and every named test file exists (the mutations themselves are not run here)."""

import pytest

from scripts import mutations
from scripts.mutations import ROOT


@pytest.mark.parametrize("m", mutations.MUTATIONS, ids=lambda m: m.name)
def test_mutation_snippet_occurs_once_and_tests_exist(m):
    text = (ROOT / m.path).read_text()
    assert text.count(m.original) == 1, f"{m.name}: snippet occurs {text.count(m.original)} times in {m.path}"
    assert m.mutated != m.original and m.tests
    for node in m.tests:
        path, _, name = node.partition("::")
        assert (ROOT / path).exists(), f"{m.name}: {path} missing"
        assert f"def {name.split('[')[0]}(" in (ROOT / path).read_text(), f"{m.name}: {node} missing"


def test_mutation_names_are_unique():
    names = [m.name for m in mutations.MUTATIONS]
    assert len(names) == len(set(names))
