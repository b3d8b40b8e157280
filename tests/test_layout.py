"""The package's shape: no import circle (function-level imports counted), few project imports inside functions, each
with its reason, no `sys.path` edits, and selfcheck on the grader's protocol."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "open_r1"


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _top_level_statements(body):
    """Module-level statements, looking into top-level if/try blocks (not functions/classes, not TYPE_CHECKING)."""
    for node in body:
        if isinstance(node, ast.If):
            test = ast.unparse(node.test)
            if "TYPE_CHECKING" not in test:
                yield from _top_level_statements(node.body)
            yield from _top_level_statements(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, *(h.body for h in node.handlers), node.orelse, node.finalbody):
                yield from _top_level_statements(block)
        else:
            yield node


def _imports(path: Path, name: str, paths: dict, everywhere: bool):
    """(node, package modules it names, inside a function?) for each import statement of one module: module level
    only (what runs when it is imported), or `everywhere` (function bodies too; TYPE_CHECKING blocks never)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    if everywhere:
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        nodes = []
        for node in ast.walk(tree):
            chain, parent = [], node
            while parent in parents:
                parent = parents[parent]
                chain.append(parent)
            if any(isinstance(p, ast.If) and "TYPE_CHECKING" in ast.unparse(p.test) for p in chain):
                continue
            nodes.append((node, any(isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef)) for p in chain)))
    else:
        nodes = [(node, False) for node in _top_level_statements(tree.body)]
    for node, in_function in nodes:
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's own package
                base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = [
                f"{module}.{alias.name}" if f"{module}.{alias.name}" in paths else module for alias in node.names
            ]
        else:
            continue
        yield node, {t for t in targets if t in paths and t != name}, in_function


def _modules(root: Path, package: str) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted((root / package).rglob("*.py"))}


def import_graph(root: Path = ROOT, package: str = PACKAGE, everywhere: bool = False) -> dict[str, set[str]]:
    """module -> package modules it imports at module level, or anywhere in its code with `everywhere`."""
    paths = _modules(root, package)
    return {
        name: set().union(*(t for _, t, _ in _imports(path, name, paths, everywhere))) for name, path in paths.items()
    }


def function_level_imports(root: Path = ROOT, package: str = PACKAGE) -> list[tuple[str, int, bool]]:
    """(file:line, the import's lines carry a comment) for every import of the package inside a function."""
    paths = _modules(root, package)
    found = []
    for name, path in paths.items():
        lines = path.read_text().splitlines()
        for node, targets, in_function in _imports(path, name, paths, everywhere=True):
            if in_function and targets:
                commented = any("#" in line for line in lines[node.lineno - 1 : node.end_lineno])
                found.append((f"{path.relative_to(root)}:{node.lineno}", commented))
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in graph.get(node, ()):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                item = stack.pop()
                on_stack.discard(item)
                component.append(item)
                if item == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_check_finds_a_circle(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("import os\nfrom .. import c\n")
    (pkg / "c.py").write_text("def f():\n    import pkg.a\nfrom pkg import a\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.a"] == {"pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.c"}
    assert cycles(graph) == [["pkg.a", "pkg.c", "pkg.sub.b"]]


def test_the_cycle_check_counts_imports_inside_functions(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg import b\n")
    (pkg / "b.py").write_text("def f():\n    from pkg import a  # defers a\n\ndef g():\n    import pkg.a\n")
    assert cycles(import_graph(tmp_path, "pkg")) == []
    assert cycles(import_graph(tmp_path, "pkg", everywhere=True)) == [["pkg.a", "pkg.b"]]
    assert function_level_imports(tmp_path, "pkg") == [("pkg/b.py:2", True), ("pkg/b.py:5", False)]


def test_no_import_circle_in_the_package_counting_imports_inside_functions():
    graph = import_graph(everywhere=True)
    assert "open_r1.grpo" in graph and "open_r1.families" in graph
    assert not cycles(graph), f"import circles: {cycles(graph)}"


# Dependencies point one way, so a project import inside a function is needed only to defer a heavy library.
MAX_FUNCTION_LEVEL_IMPORTS = 20


def test_few_project_imports_inside_functions_each_with_its_reason():
    found = function_level_imports()
    assert len(found) <= MAX_FUNCTION_LEVEL_IMPORTS, (
        f"{len(found)} imports of open_r1 inside functions (at most {MAX_FUNCTION_LEVEL_IMPORTS}): move them to the "
        f"module's top: {[where for where, _ in found]}"
    )
    silent = [where for where, commented in found if not commented]
    assert not silent, f"imports of open_r1 inside functions without a comment saying why: {silent}"


def task_imports_of_the_engine(root: Path = ROOT, package: str = PACKAGE) -> dict[str, list[str]]:
    """Engine module (everything outside `<package>/tasks/`) -> the task modules it imports anywhere in its code
    (functions too): only the registry `<package>.tasks` itself is allowed."""
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        name = module_name(path, root)
        if name.startswith(f"{package}.tasks"):
            continue
        hits = []
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                targets = [node.module]
                if node.module == f"{package}.tasks":  # `from pkg.tasks import counting` names a task folder
                    tasks_dir = root / package / "tasks"
                    targets += [
                        f"{node.module}.{alias.name}"
                        for alias in node.names
                        if (tasks_dir / alias.name).is_dir() or (tasks_dir / f"{alias.name}.py").is_file()
                    ]
            hits += [t for t in targets if t.startswith(f"{package}.tasks.")]
        if hits:
            found[name] = sorted(set(hits))
    return found


def test_the_engine_knows_no_task(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "tasks" / "counting").mkdir(parents=True)
    (pkg / "engine.py").write_text("from pkg.tasks import get_task\ndef f():\n    from pkg.tasks.counting import p\n")
    (pkg / "other.py").write_text("from pkg.tasks import counting, get_task\nimport pkg.tasks.counting.p\n")
    (pkg / "tasks" / "counting" / "p.py").write_text("from pkg import engine\n")
    assert task_imports_of_the_engine(tmp_path, "pkg") == {
        "pkg.engine": ["pkg.tasks.counting"],
        "pkg.other": ["pkg.tasks.counting", "pkg.tasks.counting.p"],
    }
    # the engine reaches a task only through the registry (open_r1.tasks.get_task, the reward registry)
    assert task_imports_of_the_engine() == {}


def test_the_package_holds_no_standin_or_bench_hook():
    """The stand-in's hidden rule and the benches' hooks live in standin/ and experiments/, wrapping public points."""
    import re

    hooks = re.compile(r"oracle|keep_oracle|apply_memory_cap")
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted((ROOT / PACKAGE).rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if hooks.search(line)
    ]
    assert not found, f"stand-in or bench hooks inside {PACKAGE}/: {found}"


def test_no_sys_path_edits_in_the_repo():
    offenders = []
    for path in sorted(ROOT.rglob("*.py")):
        if any(part.startswith(".") or part in {"build", "dist", "node_modules"} for part in path.parts):
            continue
        if path == Path(__file__).resolve():
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in {"insert", "append", "extend"}
                and ast.unparse(node.value) == "sys.path"
            ):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not offenders, f"sys.path edits (use python -m or [project.scripts] entry points): {offenders}"


def test_selfcheck_generates_with_exactly_the_protocols_new_token_budget(
    tiny_model_dir, scene_data_dir, tmp_path, monkeypatch
):
    """The grader decodes 256 new tokens: selfcheck must hand exactly protocol.EVAL_MAX_NEW_TOKENS to generate."""
    from transformers import GenerationMixin

    import selfcheck
    from open_r1.tasks.counting import protocol

    assert protocol.EVAL_MAX_NEW_TOKENS == 256  # the grader's protocol
    seen = []
    real = GenerationMixin.generate

    def spy(self, *args, **kwargs):
        seen.append(kwargs.get("max_new_tokens", getattr(kwargs.get("generation_config"), "max_new_tokens", None)))
        kwargs["max_new_tokens"] = 2  # what reached generate is recorded; decode only 2 to stay fast
        return real(self, *args, **kwargs)

    monkeypatch.setattr(GenerationMixin, "generate", spy)
    sets = [str(Path(scene_data_dir) / "val")]
    code = selfcheck.main(
        [
            "--model",
            str(tiny_model_dir),
            "--sets",
            *sets,
            "--limit",
            "2",
            "--out",
            str(tmp_path / "report.json"),
            "--quiet",
            "--device",
            "cpu",
            "--decoder",
            "hf",
        ]
        if "--decoder" in Path(selfcheck.__file__).read_text()
        else [
            "--model",
            str(tiny_model_dir),
            "--sets",
            *sets,
            "--limit",
            "2",
            "--out",
            str(tmp_path / "report.json"),
            "--quiet",
            "--device",
            "cpu",
        ]
    )
    assert code == 0
    assert seen and set(seen) == {protocol.EVAL_MAX_NEW_TOKENS}, seen
