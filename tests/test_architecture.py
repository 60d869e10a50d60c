"""The house rules the code keeps (docs/architecture.md): layering, no import circles, tests found by name."""

from __future__ import annotations

import ast
import functools
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


def _import_statements(mod: str, path: Path):
    """(module, names) of every import in ``mod``, at its top or inside a function, relative ones resolved;
    names is () for ``import x``."""
    base = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            target = ".".join(base[:len(base) - node.level + 1] + [node.module or ""]).strip(".") if node.level \
                else node.module or ""
            yield target, tuple(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            yield from ((a.name, ()) for a in node.names)


def _imports(mod: str, path: Path, known: dict) -> set[str]:
    """Every stagewise module ``mod`` imports (lazy imports count too)."""
    out = set()
    for target, names in _import_statements(mod, path):
        face = _face_names(known.get(target))  # names the package's face hands on (a function may share a module's)
        out |= {f"{target}.{n}" if f"{target}.{n}" in known and n not in face else target for n in names} \
            if names else {target}
    return {m for m in out if m in known and m != mod}


def _face_names(path: Path | None) -> set[str]:
    """The names a package's ``__init__`` hands on in its ``__all__`` (a function may share its module's name)."""
    if path is None or path.name != "__init__.py":
        return set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    return set()


@functools.cache  # the files do not change during a run; parsed once, not once per package
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


# ---- the house as a whole: floors, no circle at any level, files named by their job

#: the package's floors, from the top down: a room (a top-level module or subpackage) imports only rooms on
#: lower floors; the core's rooms (every top-level module, ``schedules``, ``lowering``, ``render``) import each
#: other without a circle. A new subpackage is given its floor here.
FLOORS = (("__main__",), ("cli",), ("workshop", "profiling"), ("hf",), ("runtime",), ("plan", "data"), ("*core",))
#: the runtime's floors, from the top down: its driver (``run``) on top, ``pipeline`` (a rank's step) under it,
#: then its parts; at the bottom its errors and config, argument checks, schedule resolution, result, DTensors
RUNTIME_FLOORS = (("run",), ("pipeline",), ("launching",), ("parallel",), ("execution",), ("messages",),
                  ("resilience",), ("stages",), ("config", "arguments", "resolve", "result", "dtensor"))


def _room(mod: str, pkg: str) -> str | None:
    """The room of ``pkg`` that holds ``mod`` (its child module or subpackage), None outside or for the face."""
    if not mod.startswith(pkg + "."):
        return None
    return mod[len(pkg) + 1:].split(".")[0]


def _room_arrows(pkg: str) -> dict[tuple[str, str], list[tuple[str, str]]]:
    """(room, room) -> the module imports behind that arrow, between different rooms of ``pkg``."""
    out: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for m, ds in _graph().items():
        a = _room(m, pkg)
        for d in ds:
            b = _room(d, pkg)
            if a and b and a != b:
                out.setdefault((a, b), []).append((m, d))
    return out


def test_no_circle_at_any_level_of_the_package():
    """In every package, its rooms (modules and subpackages) import each other without a circle, lazy imports
    included: whatever folder one looks into, each room stands above all it imports."""
    modules = _modules()
    bad = []
    for pkg in sorted(m for m, p in modules.items() if p.name == "__init__.py"):
        arrows = _room_arrows(pkg)
        graph: dict[str, set[str]] = {}
        for a, b in arrows:
            graph.setdefault(a, set()).add(b)
            graph.setdefault(b, set())
        for cycle in _cycles(graph, lambda m: True):
            ties = sorted(f"{pkg}.{a} -> {pkg}.{b}: {arrows[a, b][0][0]} imports {arrows[a, b][0][1]}"
                          for a in cycle for b in cycle if (a, b) in arrows)
            bad.append(f"circle in {pkg}: " + "; ".join(ties))
    assert not bad, "\n".join(bad)


def _floor_of(room: str, floors: tuple, pkg: str) -> int:
    for i, names in enumerate(floors):
        if room in names or ("*core" in names and room not in {n for f in floors for n in f}):
            return i
    raise AssertionError(f"{pkg}.{room} stands on no floor: give it one in tests/test_architecture.py")


def _floor_arrows_up(pkg: str, floors: tuple) -> list[str]:
    bad = []
    for (a, b), why in sorted(_room_arrows(pkg).items()):
        fa, fb = _floor_of(a, floors, pkg), _floor_of(b, floors, pkg)
        if fb < fa or (fb == fa and "*core" not in floors[fa] and len(floors[fa]) > 1 and fa < len(floors) - 1):
            bad.append(f"{pkg}.{a} (floor {len(floors) - fa}) imports {pkg}.{b} (floor {len(floors) - fb}): "
                       f"{why[0][0]} imports {why[0][1]}")
    return bad


def test_every_import_runs_down_the_floors():
    """The package's floors (``FLOORS``) and the runtime's (``RUNTIME_FLOORS``), declared: no import runs back
    up, and two rooms of one floor do not import each other (but the core's rooms and the runtime's floor)."""
    modules = _modules()
    for floors, pkg in ((FLOORS, "stagewise"), (RUNTIME_FLOORS, "stagewise.runtime")):
        rooms = {_room(m, pkg) for m in modules} - {None, "__init__"}
        for room in rooms:
            _floor_of(room, floors, pkg)
        assert not _floor_arrows_up(pkg, floors), "\n".join(_floor_arrows_up(pkg, floors))


#: names several modules may bear, because they are the same kind of thing (a CLI module may also bear its
#: command's name: ``cli/train.py`` parses ``stagewise train``, which ``runtime/run/train.py`` runs)
SAME_KIND = {
    "errors": "a package's errors",
    "search": "each planner's configuration search (plan/search from a profile, plan/cluster from a model)",
    "lowered": "each planner's data-parallel traffic played as lowered actions",
    "written": "each planner's plan written down (one format)",
    "verdict": "why each planner's winner wins",
    "data": "training data: documents packed into micro-batches (stagewise/data), an HF text file's batches (hf/data.py)",
}


def _commands() -> set[str]:
    """The CLI's command modules (``cli.COMMANDS``' keys)."""
    for node in ast.parse((PKG / "cli" / "__init__.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "COMMANDS" for t in node.targets):
            return set(ast.literal_eval(node.value))
    raise AssertionError("cli/__init__.py has no COMMANDS")


def test_files_are_named_by_their_job():
    """No two modules or packages share a name across packages unless they are the same kind of thing
    (``SAME_KIND``, a CLI command module named after its command, a folder's main module named after the
    folder): one name, one meaning."""
    commands, seen = _commands(), {}
    for mod in _modules():
        name = mod.rsplit(".", 1)[-1]
        parent = mod.split(".")[-2] if "." in mod else ""
        if mod == "stagewise" or name in SAME_KIND or name == parent \
                or (mod.startswith("stagewise.cli.") and name in commands):  # plan/auto/auto.py: the folder's own
            continue
        seen.setdefault(name, []).append(mod)
    shared = {n: ms for n, ms in seen.items() if len(ms) > 1}
    assert not shared, shared


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
            "import stagewise.plan.search.search, stagewise.plan.cluster.search, stagewise.plan.auto.auto, stagewise.split\n"
            "bad = [m for m, v in sys.modules.items() if v is not None and m.startswith(('torch', 'stagewise.runtime'))]\n"
            "assert not bad, bad\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_every_runtime_module_has_a_test_file_named_after_it():
    """A module's tests are found by its name: runtime/execution/program.py -> tests/test_runtime_program.py."""
    tests = {p.name for p in Path(__file__).parent.glob("test_*.py")}
    missing = sorted(p.relative_to(ROOT).as_posix() for p in (PKG / "runtime").rglob("*.py")
                     if p.name != "__init__.py" and f"test_runtime_{p.stem}.py" not in tests)
    assert not missing, missing


def test_every_profiling_module_has_a_test_file_named_after_it():
    """profiling/measure.py -> tests/test_profiling_measure.py, as the runtime's modules are found."""
    tests = {p.name for p in Path(__file__).parent.glob("test_*.py")}
    missing = sorted(p.relative_to(ROOT).as_posix() for p in (PKG / "profiling").rglob("*.py")
                     if p.name != "__init__.py" and f"test_profiling_{p.stem}.py" not in tests)
    assert not missing, missing


# ---- each subpackage's docstring says its job and what it may import

def _may_import(init: Path) -> tuple[bool, tuple[str, ...]]:
    """(the core allowed, the allowed names) from the ``May import:`` paragraph of a package's docstring:
    backticked names (a stagewise package or module, which allows what is under it, or a third-party one)."""
    import re

    doc = ast.get_docstring(ast.parse(init.read_text())) or ""
    m = re.search(r"^May import:(.*?)(?:\n\s*\n|\Z)", doc, re.M | re.S)
    assert m, f"{init.relative_to(ROOT)}: its docstring has no 'May import:' paragraph"
    return "the core" in m.group(1), tuple(re.findall(r"`([\w.]+)`", m.group(1)))


def _raw_imports(path: Path, mod: str) -> set[str]:
    """Every module name ``path`` imports, and each ``from`` import's module.name (which may be a module)."""
    return {x for target, names in _import_statements(mod, path) for x in (target, *(f"{target}.{n}" for n in names))}


def _owner(mod: str, modules: dict, packages: list[str]) -> str:
    """The package a module answers to: itself for a package, else the nearest package holding it."""
    if modules[mod].name == "__init__.py":
        return mod
    return max((p for p in packages if mod.startswith(p + ".")), key=len)


def test_every_subpackage_imports_only_what_its_docstring_allows():
    """A module may import within its package (subpackages included), the core where the docstring says
    "the core", the standard library, and the names the docstring lists; nothing else."""
    modules = _modules()
    core = {"stagewise"} | {m for m, p in modules.items() if m.count(".") == 1 and p.name != "__init__.py"}
    packages = sorted(m for m, p in modules.items() if p.name == "__init__.py")
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    bad = []
    for pkg in packages:
        core_ok, allowed = _may_import(modules[pkg])
        # each module answers to its nearest package: a subpackage's modules to its own docstring
        own = [m for m in modules if _owner(m, modules, packages) == pkg] if pkg != "stagewise" else sorted(core)
        for mod in own:
            for name in _raw_imports(modules[mod], mod):
                if name.startswith("stagewise"):
                    while name not in modules and "." in name:  # `from .x import func`: the module x
                        name = name.rsplit(".", 1)[0]
                    inside = name in core if pkg == "stagewise" else name == pkg or name.startswith(pkg + ".")
                    if inside or (core_ok and name in core) or any(name == a or name.startswith(a + ".")
                                                                     for a in allowed):
                        continue
                elif name.split(".")[0] in stdlib or name.split(".")[0] in allowed:
                    continue
                bad.append(f"{mod} imports {name}, which {pkg}'s docstring does not allow")
    assert not bad, "\n".join(sorted(set(bad)))


def test_colours_live_in_the_palette():
    """No colour literal in the code outside render/palette.py (the workshop's page takes its own from it too)."""
    import re

    hexes = re.compile(r"#[0-9a-fA-F]{6}\b|#[0-9a-fA-F]{3}\b(?!-)|\"(?:white|black)\"")
    found = [f"{p.relative_to(ROOT)}:{n}" for p in (*PKG.rglob("*.py"), *PKG.rglob("*.css"), *PKG.rglob("*.js"))
             if p.name != "palette.py" for n, line in enumerate(p.read_text().splitlines(), 1)
             if hexes.search(line.replace("url(#", "url("))]
    assert not found, found


def test_process_groups_and_meshes_are_made_in_one_module():
    """Only runtime/parallel/grid.py calls ``new_group``, ``init_device_mesh`` or ``DeviceMesh(...)`` (the
    ``Grid``: each group made once, every rank in one order); everything else asks it for a group."""
    makers = {"new_group", "init_device_mesh", "DeviceMesh", "new_subgroups", "new_subgroups_by_enumeration"}
    found = []
    for p in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
                if name in makers:
                    found.append(f"{p.relative_to(ROOT)}:{node.lineno} {name}")
    assert found and all(f.startswith("stagewise/runtime/parallel/grid.py:") for f in found), found
