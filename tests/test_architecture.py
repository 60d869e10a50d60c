"""The house rules the code keeps (docs/architecture.md): layering, no import circles, tests found by name."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]
PKG = ROOT / "stagewise"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(mod: str, path: Path, known: dict) -> set[str]:
    """Every stagewise module ``mod`` imports, at its top or inside a function (lazy imports count too)."""
    base = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            target = ".".join(base[:len(base) - node.level + 1] + [node.module or ""]).strip(".") if node.level \
                else node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                face = alias.name in _face_names(known.get(target))  # a name the package's face hands on
                out.add(sub if sub in known and not face else target)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return {m for m in out if m in known and m != mod}


def _face_names(path: Path | None) -> set[str]:
    """The names a package's ``__init__`` hands on in its ``__all__`` (a function may share its module's name)."""
    if path is None or path.name != "__init__.py":
        return set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    return set()


def _graph() -> dict[str, set[str]]:
    known = _modules()
    return {m: _imports(m, p, known) for m, p in known.items()}


def _cycles(graph: dict[str, set[str]], keep) -> list[list[str]]:
    """Strongly connected components of more than one module, among the modules ``keep`` accepts."""
    sub = {m: {d for d in ds if keep(d)} for m, ds in graph.items() if keep(m)}
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sub[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sub:
        if v not in index:
            visit(v)
    return out


def test_the_planner_imports_no_runtime_module():
    bad = sorted((m, d) for m, ds in _graph().items() if m.startswith("stagewise.plan")
                 for d in ds if d.startswith("stagewise.runtime"))
    assert not bad, bad


def test_the_core_imports_neither_the_runtime_nor_the_planner():
    """Schedules, simulation, splits and limits stand alone: plan/ and runtime/ build on them, not back."""
    core = [m for m, path in _modules().items() if m.count(".") == 1 and path.name != "__init__.py"
            and m.split(".")[1] not in ("notebook", "__main__")]
    graph = _graph()
    bad = sorted((m, d) for m in core for d in graph[m] if d.startswith(("stagewise.runtime", "stagewise.plan")))
    assert not bad, bad


def test_no_import_circle_in_the_runtime_or_between_it_and_the_planner():
    cycles = _cycles(_graph(), lambda m: m.startswith(("stagewise.runtime", "stagewise.plan", "stagewise.hf")))
    assert not [c for c in cycles if any(m.startswith("stagewise.runtime") for m in c)], cycles


#: the planner's folders, one job each, entered through their package (its ``__init__``: the face)
PLAN_FOLDERS = ("search", "auto", "cluster")


def test_no_import_circle_in_the_planner_or_the_cli():
    """plan/ and cli/ import downwards only: a circle (lazy imports included) fails, naming its modules."""
    cycles = _cycles(_graph(), lambda m: m.startswith(("stagewise.plan", "stagewise.cli")))
    assert not cycles, cycles


def test_each_planner_folder_is_entered_through_its_face():
    """Outside plan/search, plan/auto and plan/cluster nothing in stagewise imports their modules but through
    the folder's face (its __init__'s names), so a folder's inside can change without its users."""
    graph, bad = _graph(), []
    for folder in PLAN_FOLDERS:
        pkg = f"stagewise.plan.{folder}"
        face = _modules()[pkg]
        assert "__all__" in face.read_text(), f"{pkg} has no face (__all__ in its __init__)"
        for m, ds in graph.items():
            if m == pkg or m.startswith(pkg + "."):
                continue
            bad += [(m, d) for d in ds if d.startswith(pkg + ".")]
    assert not bad, bad
    layout = {p.parent.name for p in (PKG / "plan").glob("*/__init__.py")}
    assert layout == set(PLAN_FOLDERS), layout  # three jobs, three folders


def test_the_planner_runs_with_torch_blocked():
    code = ("import sys; sys.modules['torch'] = None\n"
            "import stagewise.plan.search.search, stagewise.plan.cluster.search, stagewise.plan.auto.auto, stagewise.layout\n"
            "bad = [m for m, v in sys.modules.items() if v is not None and m.startswith(('torch', 'stagewise.runtime'))]\n"
            "assert not bad, bad\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_every_runtime_module_has_a_test_file_named_after_it():
    """A module's tests are found by its name: runtime/execution/plan.py -> tests/test_runtime_plan.py."""
    tests = {p.name for p in Path(__file__).parent.glob("test_*.py")}
    missing = sorted(p.relative_to(ROOT).as_posix() for p in (PKG / "runtime").rglob("*.py")
                     if p.name != "__init__.py" and f"test_runtime_{p.stem}.py" not in tests)
    assert not missing, missing
