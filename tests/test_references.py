"""Every file path and stagewise module that the docs (docs/*.md, README.md) and the modules' docstrings name
exists: a reference goes stale in the commit that moves its target, not months later."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).parents[1]
PKG = ROOT / "stagewise"
TOPS = ("stagewise", "tests", "benchmarks", "examples", "docs")

#: a path with a folder: runtime/execution/program.py, stagewise/render/, tests/test_docs.py (a bare name, such
#: as rules.py, is left out: it is read against its neighbours, and several files bear most names)
PATH = re.compile(r"(?<![\w./-])((?:[A-Za-z_][\w-]*/)+(?:[\w-]+\.(?:py|md|json|csv|txt|js|css|html)\b"
                  r"|(?=[\s`'\"),:;*]|$)))")
#: a dotted stagewise name: stagewise.runtime.pipeline, stagewise.runtime.pipeline.Pipeline
DOTTED = re.compile(r"(?<![\w.])stagewise(?:\.[A-Za-z_]\w*)+")
#: paths that name something outside the repository, or a place a user makes
ELSEWHERE = re.compile(r"^(?:https?|data/|~|/|\.|torch/|transformers/|site-packages|build/|dist/|out/|runs?/|ckpt|"
                       r"checkpoints?/|models?/|my_|your|path/|folder/|some/|\w+_dir/|meta-llama/|Qwen/|"
                       r"mistralai/|deepseek|openai-community/|gpt2/|llama|org/|user/|HuggingFaceTB/|tmp/)", re.I)


def _docs() -> list[Path]:
    return sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]


def _docstrings(path: Path) -> str:
    tree = ast.parse(path.read_text())
    nodes = [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef,
                                                                      ast.AsyncFunctionDef))]
    return "\n".join(d for d in (ast.get_docstring(n) for n in nodes) if d)


def _path_exists(ref: str, here: Path) -> bool:
    """``ref`` from the repository's root, from stagewise/, or from the folder of the file naming it or one of
    its parents (a module's docstring may name a sibling package's file as ``parallel/ep.py``)."""
    ref = ref.rstrip("/")
    bases = [ROOT, PKG, *[p for p in here.parents if p == ROOT or ROOT in p.parents], *_packages()]
    return any((base / ref).exists() for base in bases)


@cache
def _packages() -> tuple[Path, ...]:
    """Every package folder: a doc names a file from its part's folder (``parallel/ep.py``, in the runtime)."""
    return tuple(p.parent for p in PKG.rglob("__init__.py"))


@cache
def _names(mod: str) -> frozenset[str]:
    """The names a module (or a package) defines or imports at its top, and a package's submodules."""
    base = ROOT / mod.replace(".", "/")
    path = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
    out = {p.stem for p in base.glob("*.py")} | {p.name for p in base.iterdir() if p.is_dir()} \
        if base.is_dir() else set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.Assign):
            out |= {t.id for t in node.targets if isinstance(t, ast.Name)}
            if any(getattr(t, "id", "") == "__all__" for t in node.targets):  # a face's names, lazy ones too
                out |= set(ast.literal_eval(node.value))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return frozenset(out)


def _module_exists(dotted: str) -> bool:
    """``stagewise.a.b`` is a module or package, or ``stagewise.a.b.Name`` a name one defines (``.Name.attr``
    beyond it is not followed)."""
    parts = dotted.split(".")
    for k in range(len(parts), 0, -1):
        base = ROOT / "/".join(parts[:k])
        if base.is_dir() and (base / "__init__.py").exists() or base.with_suffix(".py").exists():
            rest = parts[k:]
            return not rest or rest[0] in _names(".".join(parts[:k]))
    return False


#: another project named just before a path: the path is in that project (DeepSpeed's runtime/pipe/schedule.py)
THEIRS = re.compile(r"\b(Megatron|DeepSpeed|torchtitan|PyTorch|torch's|transformers|Hugging Face|vLLM|NeMo)\b")


def _stale(text: str, here: Path) -> list[str]:
    out = []
    for m in PATH.finditer(text):
        ref = m.group(1)
        if THEIRS.search(text[max(0, m.start() - 160):m.start()]):
            continue
        if ELSEWHERE.match(ref) or not (ref.split("/")[0] in TOPS or "/" in ref.rstrip("/")
                                        or ref.endswith(".py")):
            continue
        if ref.split("/")[0] not in TOPS and not any(ref.split("/")[0] == p.name for p in PKG.rglob("*")
                                                     if p.is_dir() and p.name != "__pycache__"):
            continue  # not one of this repository's folders (a user's path, an URL's tail)
        if not _path_exists(ref, here):
            out.append(ref)
    out += [d for d in DOTTED.findall(text) if not _module_exists(d)]
    return out


def test_every_path_and_module_the_docs_name_exists():
    bad = [f"{p.relative_to(ROOT)}: {ref}" for p in _docs() for ref in _stale(p.read_text(), p)]
    assert not bad, "\n".join(bad)


def test_every_path_and_module_a_docstring_names_exists():
    bad = [f"{p.relative_to(ROOT)}: {ref}" for p in sorted(PKG.rglob("*.py"))
           for ref in _stale(_docstrings(p), p)]
    assert not bad, "\n".join(bad)


def test_no_reference_to_a_design_document_the_repository_does_not_have():
    bad = [str(p.relative_to(ROOT)) for p in [*PKG.rglob("*.py"), *_docs()] if "DESIGN.md" in p.read_text()]
    assert not bad, bad
