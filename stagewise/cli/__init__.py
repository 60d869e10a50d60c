"""The `stagewise` command: one entry point, a module per group of subcommands.

Each module in ``MODULES`` has ``register(subparsers)``; a subcommand sets ``func(args) -> int``. User
errors print one line and exit 2, never a traceback; ``stagewise.flags`` says a library argument as its flag. The CLI
is a client of every other part, imported lazily by the subcommand that needs it.

May import: the core, `stagewise.schedules`, `stagewise.lowering`, `stagewise.render`, `stagewise.plan`, `stagewise.runtime`,
`stagewise.hf`, `stagewise.profiling`, `stagewise.workshop`, `torch`, `rich`.
"""

from __future__ import annotations

import gc
import importlib
import sys

from .common import USER_ERRORS, Parser
from ..flags import say

#: subcommand modules in --help order, each with its subcommands (tests/test_cli_core.py holds it to what
#: ``register`` adds): a command builds only its own module's parser, so `stagewise simulate` never imports the
#: planner to describe `plan`'s options
COMMANDS = {"core": ("list", "simulate", "compare", "export", "validate"), "demo": ("demo",),
            "explain": ("explain",), "draw": ("draw", "report"), "workshop": ("workshop",), "train": ("train",),
            "plan": ("profile", "plan", "auto")}
MODULES = list(COMMANDS)  #: the subcommand modules, in --help order


def _modules_for(argv: list[str] | None) -> list[str]:
    """The one module a command line's subcommand lives in; every module for --help, --version or a typo."""
    words = sys.argv[1:] if argv is None else argv
    for name, commands in COMMANDS.items():
        if words and words[0] in commands:
            return [name]
    return MODULES


def build_parser(modules: list[str] | None = None) -> Parser:
    parser = Parser(prog="stagewise", description="Pipeline-parallel schedules: generate, validate, "
                    "simulate, draw, plan and run them (the built-in GPT or your Hugging Face model, on local ranks "
                    "or under torchrun).")
    from .. import __version__

    parser.add_argument("--version", action="version", version=f"stagewise {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name in MODULES if modules is None else modules:
        importlib.import_module(f"{__name__}.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser(_modules_for(argv))
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except USER_ERRORS as e:
        sys.stderr.write(f"stagewise {args.command}: error: {say(str(e))}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("stagewise: interrupted\n")
        return 130
    except BrokenPipeError:
        return 0


def run() -> None:
    """The `stagewise` command (console script and ``python -m stagewise``): ``main()``, then exit with its code.

    Before exiting it freezes the collector's objects: the interpreter's shutdown would otherwise run full
    collections over every object the imports made (6 ms, a sixth of `stagewise simulate`'s own start-up), to
    find cycles whose ``__del__`` Python never promises to run for objects alive at exit anyway.
    """
    code = main()
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    run()
