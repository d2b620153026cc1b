"""Packages depend in one direction (docs/architecture.md, "Package layering").

    harnesses <- data_pipeline <- reward <- hymem_train

and inside hymem_train its parts in layers (`HYMEM_LAYERS`, models at the bottom, the entry points on
top). A module may import only its own package and the packages to its left; `harnesses` imports neither
torch nor hymem_train (it runs inside the frameworks' own venvs); and modules import each other
without cycles. Checked by parsing the source with `ast` (nothing is imported, so this is fast and
sees imports inside functions too). Every .py under the four packages is walked: no file list.
"""

from __future__ import annotations

import ast
import functools
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ORDER = ("harnesses", "data_pipeline", "reward", "hymem_train")  # a package may import only those left of it
RANK = {pkg: i for i, pkg in enumerate(ORDER)}
HARNESS_FORBIDDEN = ("torch", "hymem_train")  # harnesses run in framework venvs: no torch, no trainer


@dataclass(frozen=True)
class Import:
    importer: str  # dotted module name of the importing file
    path: str  # file, relative to the repo root
    line: int
    target: str  # dotted module imported (the most specific one: a submodule when `from pkg import sub`)
    text: str  # the statement, as written (unparsed)
    in_function: bool  # inside a def / lambda (runs when called, not when the module is imported)
    type_checking: bool  # under `if TYPE_CHECKING:` (never runs)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {
        _module_name(p): p
        for pkg in ORDER
        for p in sorted((ROOT / pkg).rglob("*.py"))
        if "__pycache__" not in p.parts
    }


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _resolve_from(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module of `from <node.module> import ...`, relative imports resolved."""
    if not node.level:
        return node.module or ""
    base = importer.split(".") if is_package else importer.split(".")[:-1]
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(modules: dict[str, Path]) -> list[Import]:
    out: list[Import] = []
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        is_package = path.name == "__init__.py"
        rel = str(path.relative_to(ROOT))

        def visit(
            node: ast.AST, in_function: bool, type_checking: bool, name=name, rel=rel, is_package=is_package
        ):
            if isinstance(node, ast.Import | ast.ImportFrom):
                if isinstance(node, ast.Import):
                    targets = [a.name for a in node.names]
                else:
                    mod = _resolve_from(name, is_package, node)
                    # `from pkg import sub` imports the submodule `pkg.sub` when there is one
                    targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in modules else mod for a in node.names]
                for t in dict.fromkeys(targets):
                    out.append(
                        Import(name, rel, node.lineno, t, ast.unparse(node), in_function, type_checking)
                    )
                return
            if isinstance(node, ast.If) and _is_type_checking(node.test):
                for child in node.body:
                    visit(child, in_function, True)
                for child in node.orelse:
                    visit(child, in_function, type_checking)
                return
            inner = in_function or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            for child in ast.iter_child_nodes(node):
                visit(child, inner, type_checking)

        visit(tree, False, False)
    return out


MODULES = _modules()
IMPORTS = _imports(MODULES)


def _top(module: str) -> str:
    return module.split(".", 1)[0]


def test_every_package_is_walked():
    assert {_top(m) for m in MODULES} == set(ORDER)
    assert any(i.in_function for i in IMPORTS)  # function-level imports are seen too


def test_packages_import_only_to_their_left():
    """Any import, at module level or inside a function (or under TYPE_CHECKING), counts."""
    bad = [
        f"{i.path}:{i.line}: {i.text}  ({_top(i.importer)} may not import {_top(i.target)})"
        for i in IMPORTS
        if _top(i.target) in RANK and RANK[_top(i.target)] > RANK[_top(i.importer)]
    ]
    assert not bad, "imports against the package order " + " <- ".join(ORDER) + ":\n" + "\n".join(bad)


def test_harnesses_import_neither_torch_nor_hymem_train():
    bad = [
        f"{i.path}:{i.line}: {i.text}"
        for i in IMPORTS
        if _top(i.importer) == "harnesses" and _top(i.target) in HARNESS_FORBIDDEN
    ]
    assert not bad, "harnesses/ runs in framework venvs, without torch or hymem_train:\n" + "\n".join(bad)


# inside hymem_train, bottom to top: a module imports its own part and the parts of lower layers only
HYMEM_LAYERS: tuple[tuple[str, ...], ...] = (
    ("__init__", "lazy", "config", "segments"),
    ("models",),
    ("trainer",),  # the policy, its losses, packing, checkpoints and export
    ("engines",),  # HF / vLLM inference; serving a trained checkpoint needs trainer's export
    ("gateway",),
    ("rollout",),
    ("evaluation",),
    ("callbacks",),
    ("run_config", "logger", "cluster", "checkpointing", "preemption"),
    ("stage", "heldout"),
    ("frozen_models",),  # the RL stage's reader and judge servers
    ("opd", "rl", "sft", "serve", "evaluate", "export", "launch", "plan"),  # entry points
)
HYMEM_RANK = {part: i for i, layer in enumerate(HYMEM_LAYERS) for part in layer}


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_hymem_train_part_has_a_layer():
    parts = {_part(m) for m in MODULES if _top(m) == "hymem_train"}
    assert parts == set(HYMEM_RANK), f"place these in HYMEM_LAYERS: {sorted(parts ^ set(HYMEM_RANK))}"


def test_hymem_train_modules_import_only_their_layer_and_below():
    """Imports inside functions count; `if TYPE_CHECKING:` ones (annotations only) do not."""
    bad = [
        f"{i.path}:{i.line}: {i.text}  ({_part(i.importer)} may not import {_part(i.target)})"
        for i in IMPORTS
        if _top(i.importer) == _top(i.target) == "hymem_train"
        and not i.type_checking
        and HYMEM_RANK[_part(i.target)] > HYMEM_RANK[_part(i.importer)]
    ]
    assert not bad, (
        "imports against hymem_train's layers (tests/test_layering.py HYMEM_LAYERS):\n" + "\n".join(bad)
    )


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One concrete cycle per strongly connected component (Tarjan), as [m1, m2, ..., m1]."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    sccs: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in edges.get(v, ()):
                sccs.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            strong(v)
    out = []
    for comp in sccs:
        members, start = set(comp), comp[0]
        # shortest path back to `start` inside the component (BFS)
        prev: dict[str, str] = {}
        frontier, seen, end = [start], {start}, None
        while frontier and end is None:
            nxt = []
            for v in frontier:
                for w in sorted(edges.get(v, ())):
                    if w == start:
                        end = v
                        break
                    if w in members and w not in seen:
                        seen.add(w)
                        prev[w] = v
                        nxt.append(w)
                if end is not None:
                    break
            frontier = nxt
        path = [start]
        v = end
        while v is not None and v != start:
            path.insert(1, v)
            v = prev.get(v)
        out.append(path + [start])
    return out


def test_no_import_cycles():
    """No module imports itself through other modules of the four packages.

    Imports inside functions count too (they are marked in the message). A module-level cycle can fail
    at import time on a half-initialised module; a cycle through a function-level import cannot, but it
    is still two modules that need each other (harnesses.registry <-> harnesses.sandbox was one), and
    lazy imports are here to keep heavy dependencies (torch, ray, vllm) off import paths, not to hide
    cycles. Today there are none either way; if a lazy-import cycle is ever intended, exempt that one
    edge here, with the reason, rather than dropping function-level imports from the graph.
    `if TYPE_CHECKING:` imports never run and do not count. An edge goes to the module imported (a
    submodule for `from pkg import sub`), not to the parent packages whose __init__ Python also runs.
    """
    edges: dict[str, set[str]] = {}
    where: dict[tuple[str, str], Import] = {}
    for i in IMPORTS:
        if i.type_checking or i.target not in MODULES:
            continue
        edges.setdefault(i.importer, set()).add(i.target)
        key = (i.importer, i.target)
        if key not in where or (where[key].in_function and not i.in_function):
            where[key] = i  # show a module-level import of that edge when there is one
    cycles = _cycles(edges)
    msgs = []
    for c in cycles:
        hops = [where[(a, b)] for a, b in zip(c, c[1:], strict=False)]
        msgs.append(
            " -> ".join(c)
            + "\n"
            + "\n".join(
                f"    {h.path}:{h.line}: {h.text}{'  (in a function)' if h.in_function else ''}" for h in hops
            )
        )
    assert not cycles, "import cycles:\n" + "\n".join(msgs)


def test_relative_imports_resolve():
    def resolve(importer, is_package, stmt):
        return _resolve_from(importer, is_package, ast.parse(stmt).body[0])

    assert resolve("harnesses.adapters.mem0", False, "from ..base import Harness") == "harnesses.base"
    assert resolve("harnesses.adapters.mem0", False, "from . import everos") == "harnesses.adapters"
    assert resolve("harnesses.adapters", True, "from .mem0 import X") == "harnesses.adapters.mem0"
    assert resolve("reward.judge", False, "from .llm import ChatClient") == "reward.llm"
    assert resolve("reward.judge", False, "from reward.llm import ChatClient") == "reward.llm"


STDLIB = frozenset(sys.stdlib_module_names) | {"__future__"}


@functools.cache  # read once per package, not once per import statement
def _lazy_exports(package: str) -> dict[str, str]:
    """A lazy package's `_EXPORTS` (hymem_train/lazy.py): name -> the submodule that defines it."""
    path = MODULES.get(package)
    if path is None or path.name != "__init__.py":
        return {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "_EXPORTS" for t in node.targets):
            return ast.literal_eval(node.value)
    return {}


def _runs(i: Import) -> list[str]:
    """The modules an import statement really loads: a lazy package's export resolves to its submodule."""
    node = ast.parse(i.text).body[0]
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    exports = _lazy_exports(i.target)
    return [f"{i.target}.{exports[a.name]}" if a.name in exports else i.target for a in node.names]


def _loads(module: str, edges: dict[str, set[str]], modules: dict[str, Path]) -> tuple[set[str], set[str]]:
    """(third-party packages, first-party modules) that importing `module` loads: its module-level
    imports, transitively, and the packages above each module (Python runs their __init__)."""
    third, seen, todo = set(), set(), [module]
    while todo:
        m = todo.pop()
        parts = m.split(".")
        for x in [m] + [".".join(parts[:k]) for k in range(1, len(parts))]:
            if x in seen:
                continue
            seen.add(x)
            if x in modules:
                todo.extend(edges.get(x, ()))
            elif _top(x) not in STDLIB and _top(x) not in FIRST_PARTY:
                third.add(_top(x))
    return third, seen & set(modules)


# tests/ too (its helpers import the packages); scripts/ and benchmarks/ import inside functions after
# putting the repository root on sys.path, or run under another venv
FIRST_PARTY = (*ORDER, "tests")


def test_imports_inside_functions_defer_a_package():
    """An import of the standard library or of the first-party packages sits inside a function only
    where it keeps a third-party package (torch, transformers, Ray, ...) off the importer's import path,
    or where a module-level import would be a cycle. A third-party import inside a function defers that
    package (its name is the reason). docs/contributing.md, "Imports at the top"."""
    modules = {**MODULES, **{_module_name(p): p for p in sorted((ROOT / "tests").rglob("*.py"))}}
    imports = _imports(modules)
    edges: dict[str, set[str]] = {}
    for i in imports:
        if not i.in_function and not i.type_checking:
            edges.setdefault(i.importer, set()).update(_runs(i))
    bad = []
    for i in imports:
        if not i.in_function or i.type_checking:
            continue
        mine, _ = _loads(i.importer, edges, modules)
        for t in _runs(i):
            if _top(t) not in FIRST_PARTY and _top(t) not in STDLIB:
                continue
            theirs, their_modules = _loads(t, edges, modules)
            if not (theirs - mine) and i.importer not in their_modules:
                bad.append(f"{i.path}:{i.line}: {i.text}  (loads nothing {i.importer} does not: move it up)")
    assert not bad, "imports inside functions that defer nothing:\n" + "\n".join(sorted(set(bad)))


# Every Ray rollout actor (rollout.num_workers per RL run; up to one per rollout in flight) imports the
# worker's module path at start-up: a heavy package there is paid that many times per run.
ROLLOUT_ACTOR_FORBIDDEN = frozenset({"datasets", "pandas", "pyarrow", "torch", "transformers"})


def test_the_rollout_actor_imports_no_heavy_package():
    edges: dict[str, set[str]] = {}
    for i in IMPORTS:
        if not i.in_function and not i.type_checking:
            edges.setdefault(i.importer, set()).update(_runs(i))
    third, _ = _loads("hymem_train.rollout.worker", edges, MODULES)
    assert not third & ROLLOUT_ACTOR_FORBIDDEN, (
        f"importing hymem_train.rollout.worker loads {sorted(third & ROLLOUT_ACTOR_FORBIDDEN)}"
    )
