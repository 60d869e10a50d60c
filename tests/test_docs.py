"""The docs as a user meets them: every runnable block runs, shown outputs are what the code prints, every
command shown parses, every link and anchor exists, docs/api.md's signatures are the code's.

The marks are docs_helpers' (and docs/contributing.md's)."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import docs_helpers as docs
from preloaded import Preloaded

MARKS = {"run", "signatures"}
RUNS = {"sh", "console", "python"}
HANG_S = 240  #: a block that takes this long is hung (each is sized to take seconds; pytest-timeout stops a test at 300)


def _ids(pages):
    return [p.relative_to(docs.ROOT).as_posix() for p in pages]


def _scratch(tmp: Path) -> Path:
    for rel in docs.SCRATCH:
        src, dst = docs.ROOT / rel, tmp / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if src.is_dir() else shutil.copy)(src, dst)
    return tmp


def _env() -> dict:
    bin_dir = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STAGEWISE_")}
    return {**env, "PATH": bin_dir + os.pathsep + env.get("PATH", ""), "NO_COLOR": "1", "PYTHONUNBUFFERED": "1"}


#: what the blocks' processes import that takes seconds: imported once by the preloaded server they fork from
PRELOAD = ("torch", "torch._dynamo", "stagewise.cli", "stagewise.runtime.run.worker", "stagewise.hf.hf_run",
           "transformers.loss.loss_utils", "transformers.masking_utils", "transformers.modeling_utils")


@pytest.fixture(scope="module")
def preloaded(tmp_path_factory):
    """The blocks' `stagewise` and `python FILE` commands, each a process forked from one interpreter that
    imported ``PRELOAD`` (preloaded.py: what a fresh process would do differently is kept out or checked)."""
    server = Preloaded(tmp_path_factory.mktemp("preloaded"), _env(), PRELOAD)
    yield server
    server.close()


def _run(args, cwd: Path, what: str, server: Preloaded) -> subprocess.CompletedProcess:
    env = {**server.env, "PATH": server.path(_env()["PATH"])}
    try:
        return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=HANG_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{what}: still running after {HANG_S} s")


def _run_block(block: docs.Block, cwd: Path, server: Preloaded) -> None:
    if block.lang == "python":
        script = cwd / f"block_{block.line}.py"
        script.write_text(block.text)
        done = _run([str(server.bin / "run-python-file"), script.name], cwd, block.where, server)
        assert done.returncode == 0, f"{block.where}: exit {done.returncode}\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    elif block.lang == "sh":
        done = _run(["bash", "-euo", "pipefail", "-c", block.text], cwd, block.where, server)
        assert done.returncode == 0, f"{block.where}: exit {done.returncode}\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    else:
        for command, shown in docs.console(block.text):
            done = _run(["bash", "-o", "pipefail", "-c", command + " 2>&1"], cwd, f"{block.where}: $ {command}", server)
            got = done.stdout.splitlines()
            want = docs.expected_rc(shown)
            assert done.returncode == want, \
                f"{block.where}: $ {command}: exit {done.returncode}, not {want}\n{done.stdout[-3000:]}"
            assert docs.matches(shown, got), (f"{block.where}: $ {command}: the output differs from the page's\n"
                                              "--- shown\n" + "\n".join(shown) + "\n--- printed\n" + done.stdout)


def test_the_readme_is_a_front_door():
    text = (docs.ROOT / "README.md").read_text()
    assert len(text.splitlines()) < 300
    first = docs.blocks(docs.ROOT / "README.md")[0]
    assert [c.split()[:2] for c in docs.commands(first)] == [["make", "demo"], ["make", "test"]], first.text
    assert "make test" in (docs.ROOT / ".ci" / "run").read_text()


def test_the_readme_answers_the_first_questions_with_a_runnable_block():
    """Own model at pp x fsdp, resume at another layout, plan for 1,024 GPUs: each a runnable block."""
    runnable = [b.text for b in docs.blocks(docs.ROOT / "README.md") if "run" in b.marks]
    assert any("stagewise.Pipeline(" in t and "fsdp=" in t for t in runnable)
    assert any("--save" in t and "--resume" in t for t in runnable)
    assert any("stagewise plan" in t and "--gpus 1024" in t for t in runnable)


@pytest.mark.parametrize("page", docs.PAGES, ids=_ids(docs.PAGES))
def test_marks_are_known(page):
    for b in docs.blocks(page):
        assert set(b.marks) <= MARKS, f"{b.where}: unknown marks {b.marks}"
        assert "run" not in b.marks or b.lang in RUNS, f"{b.where}: `run` on a {b.lang or 'bare'} block"
        assert "signatures" not in b.marks or (b.lang == "python" and page.name == "api.md"), b.where


RUNNABLE = [p for p in docs.PAGES if any("run" in b.marks for b in docs.blocks(p))]


@pytest.mark.slow
@pytest.mark.timeout(900)  # a hang bound for a whole page on a loaded machine; each block is sized in seconds
@pytest.mark.parametrize("page", RUNNABLE, ids=_ids(RUNNABLE))
def test_every_runnable_block_runs(page, tmp_path, preloaded):
    cwd = _scratch(tmp_path)
    for block in docs.blocks(page):
        if "run" in block.marks:
            _run_block(block, cwd, preloaded)


@pytest.mark.parametrize("page", docs.PAGES, ids=_ids(docs.PAGES))
def test_every_command_shown_parses(page):
    """A command that cannot run here (GPUs, a download, 16,384 GPUs) still uses options that exist."""
    from stagewise.cli import build_parser

    for b in docs.blocks(page):
        if b.lang not in ("sh", "console", "bash") or "run" in b.marks:  # runnable ones run: their test says
            continue
        for command in docs.commands(b):
            for argv in docs.stagewise_argv(command):
                err = io.StringIO()
                with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                    try:
                        build_parser().parse_args(argv)
                    except SystemExit as e:
                        assert e.code == 0, f"{b.where}: `stagewise {' '.join(argv)}` does not parse: {err.getvalue()}"
            for script in docs.python_files(command):  # the repository's scripts; a bare name is the user's
                assert "/" not in script or (docs.ROOT / script).is_file(), f"{b.where}: {script} does not exist"


@pytest.mark.parametrize("page", docs.PAGES, ids=_ids(docs.PAGES))
def test_links_and_anchors_exist(page):
    for line, target in docs.links(page):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.is_relative_to(docs.ROOT), f"{page.name}:{line}: {target} points outside the repository"
        assert dest.exists(), f"{page.name}:{line}: {target}: no such file"
        if anchor:
            assert dest.suffix == ".md", f"{page.name}:{line}: {target}: an anchor into a non-Markdown file"
            assert anchor in docs.anchors(dest), f"{page.name}:{line}: {target}: no heading with that anchor"


def test_every_page_is_linked_from_the_index():
    linked = {(docs.ROOT / "docs" / t.partition("#")[0]).resolve() for _, t in docs.links(docs.ROOT / "docs" / "index.md")}
    missing = [p.name for p in docs.PAGES if p.parent.name == "docs" and p.name != "index.md" and p not in linked]
    assert not missing, missing
    assert any(t.startswith("docs/index.md") for _, t in docs.links(docs.ROOT / "README.md"))


# ---- docs/api.md's signatures

def _entries(text: str):
    """(name, rest) of each signature entry: a dotted name at the start of a line, continued by indented lines."""
    out: list[list[str]] = []
    for line in text.splitlines():
        if line[:1].isalpha():
            out.append([line])
        elif out and line.strip():
            out[-1].append(line)
    for lines in out:
        entry = " ".join(x.strip() for x in lines)
        name = entry.split("(")[0].split(":")[0].split()[0]
        yield name, entry[len(name):]


def _resolve(name: str):
    import stagewise

    parts = name.split(".")
    obj = stagewise if parts[0] == "stagewise" else getattr(stagewise, parts[0])
    for k, part in enumerate(parts[1:], 1):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            obj = importlib.import_module(".".join(parts[:k + 1]))
    return obj


def _params(rest: str):
    """The documented parameters: (name, kind, default text or None)."""
    import ast

    depth, end = 0, None
    for k, c in enumerate(rest):
        depth += c == "("
        depth -= c == ")"
        if depth == 0 and c == ")":
            end = k
            break
    fn = ast.parse(f"def _f({rest[1:end]}): pass").body[0].args
    pos = fn.posonlyargs + fn.args
    defaults = [None] * (len(pos) - len(fn.defaults)) + [ast.unparse(d) for d in fn.defaults]
    out = [(a.arg, "POSITIONAL_OR_KEYWORD", d) for a, d in zip(pos, defaults)]
    if fn.vararg:
        out.append((fn.vararg.arg, "VAR_POSITIONAL", None))
    out += [(a.arg, "KEYWORD_ONLY", None if d is None else ast.unparse(d)) for a, d in zip(fn.kwonlyargs, fn.kw_defaults)]
    if fn.kwarg:
        out.append((fn.kwarg.arg, "VAR_KEYWORD", None))
    return out


def _actual(obj):
    """The code's parameters: (name, kind, default or ``inspect.Parameter.empty``)."""
    out = []
    for p in inspect.signature(obj).parameters.values():
        if p.name not in ("self", "cls"):
            out.append((p.name, "POSITIONAL_OR_KEYWORD" if p.kind == p.POSITIONAL_ONLY else p.kind.name, p.default))
    return out


def _same_default(text: str | None, value) -> bool:
    import ast

    if value is inspect.Parameter.empty:
        return text is None
    if text is None:
        return False
    try:
        return ast.literal_eval(text) == value
    except (ValueError, SyntaxError):  # a name: `torch.float32`, a function
        return text.split(".")[-1] == getattr(value, "__name__", repr(value))


SIGNATURES = [b for b in docs.blocks(docs.ROOT / "docs" / "api.md") if "signatures" in b.marks]


def test_api_md_has_signature_blocks():
    assert SIGNATURES and any("stagewise.Pipeline(" in b.text for b in SIGNATURES)


@pytest.mark.parametrize("block", SIGNATURES, ids=[b.where for b in SIGNATURES])
def test_api_md_signatures_are_the_codes(block):
    for name, rest in _entries(block.text):
        obj = _resolve(name)
        if rest.lstrip().startswith(":"):  # attributes: `Name: .a (type), .b ...`
            import re

            for attr in re.findall(r"(?<![\w)])\.(\w+)", rest):
                assert hasattr(obj, attr) or attr in getattr(obj, "__dataclass_fields__", {}), f"{name}.{attr}"
            continue
        documented, actual = _params(rest), _actual(obj)
        assert [(n, k) for n, k, _ in documented] == [(n, k) for n, k, _ in actual], \
            f"{name}: documented {[n for n, _, _ in documented]}\n  the code's {[n for n, _, _ in actual]}"
        for (n, _, d), (_, _, v) in zip(documented, actual):
            assert _same_default(d, v), f"{name}: `{n}` defaults to {v!r} in the code, {d} in docs/api.md"


def test_every_public_pipeline_method_is_in_api_md():
    import stagewise

    text = "".join(b.text for b in SIGNATURES)
    public = [n for n, _ in inspect.getmembers(stagewise.Pipeline) if not n.startswith("_")]
    missing = [n for n in public if f"Pipeline.{n}" not in text]
    assert not missing, missing
