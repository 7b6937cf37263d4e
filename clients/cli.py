"""simulserve: simultaneous machine translation for live text streams (GMA, wait-k, offline).

The `simulserve` command: each subcommand lives in the module that does the work.

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

# subcommand -> (module that registers it, its one-line summary). The summary is what `simulserve`
# with no arguments lists without importing anything; each module's `help=` repeats it (a test
# holds the two together).
COMMANDS = {
    "serve": ("server.cli", "run the websocket streaming server (and the caption page at /)"),
    "stream": ("clients.stream", "stream text to a simulserve server and show live captions"),
    "translate": ("models.translate", "translate sentences with simulated streaming (JSON lines out)"),
    "evaluate": ("agents.evaluate", "BLEU-latency sweep (AL/LAAL/AP/DAL/CW, both conventions) with table, JSON, "
                                    "CSV, plot"),
    "plot-alignment": ("agents.plot_alignment", "heatmap of one sentence's cross-attention with GMA's p_i and "
                                                "the READ/WRITE path"),
    "prepare-data": ("models.data.cli", "build German-English training data from PyPI/Debian packages"),
    "train": ("models.training.cli", "train or resume a model from a YAML recipe"),
    "train-segmenter": ("models.training.segmenter", "train the sentence-boundary classifier that segments "
                                                     "unbounded streams"),
    "bench": ("clients.bench_cli", "benchmarks: the streaming engine, the step, or a running server"),
    "convert-ctranslate2": ("models.ctranslate2_peer", "write a checkpoint as a CTranslate2 model directory "
                                                       "(offline models)"),
}


def overview() -> str:
    """What `simulserve` with no arguments prints: every subcommand with its one line."""
    width = max(map(len, COMMANDS)) + 2
    rows = "\n".join(f"  {name:<{width}}{summary}" for name, (_, summary) in COMMANDS.items())
    return (f"usage: simulserve COMMAND [options]\n\n{__doc__.splitlines()[0]}\n\ncommands:\n{rows}\n\n"
            "`simulserve COMMAND -h` shows a command's options and an example.\n")


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="simulserve", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = argv[0] if argv and argv[0] in COMMANDS else None
    for name, (module, summary) in COMMANDS.items():
        if wanted is not None and name != wanted:
            sub.add_parser(name, help=summary)
            continue
        try:
            importlib.import_module(module).register(sub)
        except ModuleNotFoundError as e:
            if e.name and (e.name == module or module.startswith(e.name + ".")):
                sub.add_parser(name, help=summary + " (not available in this build)")
            else:
                raise
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print(overview(), end="")
        return 2
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
