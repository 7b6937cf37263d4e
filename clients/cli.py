"""The `simulserve` command: each subcommand lives in the module that does the work.

Every module listed here exposes `register(subparsers)`, which adds its
subcommand and sets `func(args) -> int`. Modules are imported lazily so that
`simulserve translate` does not pay for FastAPI and `simulserve serve` does not
pay for matplotlib.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from models.errors import UserError

# subcommand name -> module that registers it
COMMANDS = {
    "train": "models.training.cli",
    "translate": "models.translate",
    "prepare-data": "models.data.cli",
    "bench": "clients.bench_cli",
    "evaluate": "agents.evaluate",
    "plot-alignment": "agents.plot_alignment",
    "serve": "server.cli",
    "stream": "clients.stream",
}


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="simulserve", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = argv[0] if argv and argv[0] in COMMANDS else None
    for name, module in COMMANDS.items():
        if wanted is not None and name != wanted:
            sub.add_parser(name, help="(run `simulserve %s -h`)" % name)
            continue
        try:
            importlib.import_module(module).register(sub)
        except ModuleNotFoundError as e:
            if e.name and (e.name == module or module.startswith(e.name + ".")):
                sub.add_parser(name, help="(not available in this build)")
            else:
                raise
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (UserError, FileNotFoundError) as e:
        # bad checkpoint, bad setting, bad input: a message for the user, no traceback
        print(f"simulserve {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
