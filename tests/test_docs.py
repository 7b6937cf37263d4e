"""The documentation cannot rot: README.md and docs/*.md are checked against the code.

- every `simulserve ...` command line (in code blocks and in inline code) parses with the real CLI
  parser of clients/cli.py: the subcommand and every flag exist (nothing is run);
- every relative link and image resolves (and a `#fragment` names a heading of the target page);
- no machine-specific absolute paths;
- docs/protocol.md's tables match the pydantic schemas and error codes of server/protocol.py, and
  its example exchange validates against them;
- README.md stays short and shows the two minimal clients exactly as tests/test_readme_clients.py runs them;
- every subcommand's --help has a one-line description and an example that parses, and `simulserve`
  with no arguments lists every subcommand with its one line.
"""
from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from clients.cli import COMMANDS, build_parser, main
from server import protocol

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README] + sorted((ROOT / "docs").glob("*.md"))                      # commands are checked here
LINKED = PAGES + sorted((ROOT / "docs" / "results").glob("*.md")) + [ROOT / "CHANGELOG.md"]
MACHINE_PATH = re.compile(r"(?<![\w.~$-])/(?:work|root|home|Users|mnt)/|\b[A-Z]:\\\\")
FENCE = re.compile(r"^(```|~~~)")
SHELL_OPS = {"|", "||", "&&", ";", "&"}
REDIRECT = re.compile(r"^\d?(<|>|>>)(&\d)?$|^\d?>")


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def blocks_and_prose(text: str) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(code lines, prose lines) as (line number, text); continuation lines (`\\`) of code are joined."""
    code, prose, inside, pending = [], [], False, None
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line.strip()):
            inside = not inside
            continue
        if not inside:
            prose.append((n, line))
            continue
        if pending is not None:
            line = pending[1] + " " + line.strip()
            n = pending[0]
        if line.rstrip().endswith("\\"):
            pending = (n, line.rstrip()[:-1])
            continue
        pending = None
        code.append((n, line))
    return code, prose


def simulserve_argvs(line: str) -> list[list[str]]:
    """The argv of every `simulserve` invocation on a shell line (also `python -m clients.cli`)."""
    if "simulserve" not in line and "clients.cli" not in line:
        return []
    try:
        tokens = shlex.split(line, comments=True)
    except ValueError:
        return []
    out, segment = [], []
    for tok in tokens + ["|"]:
        if tok not in SHELL_OPS:
            segment.append(tok)
            continue
        words = [t for t in segment if not re.fullmatch(r"[A-Z_]+=\S*", t)]  # without leading VAR=value
        prog = words[0] if words else ""
        start = None
        if prog == "simulserve" or prog.endswith("/simulserve"):
            start = 1
        elif Path(prog).name.startswith(("python", "torchrun")) and "clients.cli" in words[1:]:
            i = words.index("clients.cli")
            start = i + 1 if words[i - 1] == "-m" else None
        if start is not None:
            argv = []
            for a in words[start:]:
                if REDIRECT.match(a):
                    break
                argv.append(a)
            out.append(argv)
        segment = []
    return out


def paragraphs(prose: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Consecutive prose lines joined: (first line number, text)."""
    out, last = [], None
    for n, line in prose:
        if line.strip() and last is not None and n == last + 1 and out:
            out[-1] = (out[-1][0], out[-1][1] + " " + line.strip())
        elif line.strip():
            out.append((n, line.strip()))
        last = n if line.strip() else None
    return out


def command_lines(page: Path):
    """(line number, argv, whole command?) of every simulserve command in code blocks and inline code.

    Inline code that only names a command (`simulserve evaluate`, `simulserve bench server`) is a
    mention: its subcommand must exist, but its required arguments are not expected."""
    code, prose = blocks_and_prose(page.read_text(encoding="utf-8"))
    for n, line in code:
        for argv in simulserve_argvs(line):
            yield n, argv, True
    for n, paragraph in paragraphs(prose):  # inline code may wrap across lines
        for span in re.findall(r"`([^`]+)`", paragraph):
            if span.startswith("simulserve") or " clients.cli " in span:
                for argv in simulserve_argvs(span):
                    yield n, argv, len(argv) > 2 or any(a.startswith("-") for a in argv)


def parse_error(argv: list[str]) -> str | None:
    """None if the real parser accepts argv; otherwise argparse's message."""
    if "-h" in argv or "--help" in argv:
        argv = [a for a in argv if a not in ("-h", "--help")]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            build_parser(argv).parse_args(argv)
    except SystemExit as e:
        return err.getvalue().strip().splitlines()[-1] if e.code else None
    return None


def _benchmarks() -> set[str]:
    """The `bench` subcommands, read from the real parser."""
    import argparse
    from clients.cli import build_parser
    parser = build_parser(["bench"])
    bench = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["bench"]
    return set(next(a for a in bench._actions if isinstance(a, argparse._SubParsersAction)).choices)


BENCHMARKS = _benchmarks()


def test_command_lines_parse_with_the_real_cli():
    checked, bad = 0, []
    for page in PAGES:
        for n, argv, whole in command_lines(page):
            checked += 1
            if argv and argv[0] not in COMMANDS and not argv[0].startswith("-"):
                bad.append(f"{rel(page)}:{n}: simulserve {' '.join(argv)}: no subcommand {argv[0]!r}")
            elif not whole and argv[:1] == ["bench"] and argv[1:] and argv[1] not in BENCHMARKS:
                bad.append(f"{rel(page)}:{n}: simulserve {' '.join(argv)}: no benchmark {argv[1]!r}")
            elif whole and (msg := parse_error(argv)) is not None:
                bad.append(f"{rel(page)}:{n}: simulserve {' '.join(argv)}: {msg}")
    assert not bad, "documented commands the CLI refuses:\n" + "\n".join(bad)
    assert checked >= 40, f"only {checked} command lines found: is the extraction broken?"


def test_the_checker_refuses_a_wrong_command():
    """The check above could pass by accident; make sure it catches each kind of mistake."""
    assert simulserve_argvs("cat notes.txt | simulserve stream --auto-segment  # comment") == \
        [["stream", "--auto-segment"]]
    assert simulserve_argvs("torchrun --nproc_per_node 2 -m clients.cli train r.yaml") == [["train", "r.yaml"]]
    assert simulserve_argvs("simulserve translate -i a.de > out.jsonl") == [["translate", "-i", "a.de"]]
    assert parse_error(["translate", "--no-such-flag"]) is not None
    assert parse_error(["serve", "--port", "eighty"]) is not None
    assert parse_error(["bench", "engine", "--count", "3"]) is None


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[`*]", "", heading.strip().lower())  # markup goes; letters, digits, _ and - stay
    return re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", text))


def anchors(page: Path) -> set[str]:
    code, prose = blocks_and_prose(page.read_text(encoding="utf-8"))
    return {slug(m.group(1)) for _, line in prose if (m := re.match(r"#{1,6}\s+(.*)", line))}


def test_links_and_images_resolve():
    checked, bad = 0, []
    for page in LINKED:
        if not page.exists():
            continue
        _, prose = blocks_and_prose(page.read_text(encoding="utf-8"))
        for n, line in prose:
            line = re.sub(r"`[^`]*`", "", line)
            for target in re.findall(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", line) + \
                    re.findall(r"<(?:img|a)\s[^>]*(?:src|href)=\"([^\"]+)\"", line):
                if re.match(r"[a-z]+:", target):
                    continue  # http(s), mailto: not checked here
                checked += 1
                path, _, fragment = target.partition("#")
                dest = (page.parent / path).resolve() if path else page
                if not dest.exists():
                    bad.append(f"{rel(page)}:{n}: {target}: no such file")
                elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
                    bad.append(f"{rel(page)}:{n}: {target}: no heading #{fragment} in {dest.name}")
    assert not bad, "broken links:\n" + "\n".join(bad)
    assert checked >= 20


def test_slug_matches_github():
    assert slug("Training data: `simulserve prepare-data`") == "training-data-simulserve-prepare-data"
    assert slug("Metrics (`GET /metrics`)") == "metrics-get-metrics"
    assert slug("Client → server") == "client--server"
    assert slug("The `limits` of max_streams") == "the-limits-of-max_streams"


def test_no_machine_specific_paths():
    results = sorted((ROOT / "docs" / "results").glob("*.json")) + sorted((ROOT / "docs" / "results").glob("*.csv"))
    bad = [f"{rel(p)}:{n}: {line.strip()}" for p in [*LINKED, *results] if p.exists()
           for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if MACHINE_PATH.search(line)]
    assert not bad, "machine-specific absolute paths (use paths relative to the repository or placeholders):\n" \
        + "\n".join(bad)


# ---------------------------------------------------------------- the protocol page against the schemas
PROTOCOL = ROOT / "docs" / "protocol.md"


def table_after(heading: str) -> list[list[str]]:
    """The rows (cells) of the first table after a heading of docs/protocol.md."""
    lines = PROTOCOL.read_text(encoding="utf-8").splitlines()
    i = next(i for i, line in enumerate(lines) if line.lstrip("#").strip() == heading)
    while not lines[i].startswith("|"):
        i += 1
    rows = []
    while i < len(lines) and lines[i].startswith("|"):
        rows.append([c.strip() for c in lines[i].strip().strip("|").split("|")])
        i += 1
    return rows[2:]  # without the header and the --- row


def first_code(cell: str) -> str:
    return re.match(r"`([^`]+)`", cell).group(1)


def field_names(cell: str) -> set[str]:
    return {t for t in re.findall(r"`([^`]+)`", cell) if re.fullmatch(r"[a-z_]+", t)}


def message_classes(union) -> dict[str, type]:
    members = typing.get_args(typing.get_args(union)[0])
    return {typing.get_args(cls.model_fields["type"].annotation)[0]: cls for cls in members}


@pytest.mark.parametrize("heading,union,common", [("Client → server", protocol.ClientMessage, {"type", "id"}),
                                                  ("Server → client", protocol.ServerMessage, {"type"})])
def test_protocol_message_tables_match_the_schemas(heading, union, common):
    classes = message_classes(union)
    rows = {first_code(r[0]): field_names(r[1]) for r in table_after(heading)}
    assert set(rows) == set(classes), f"{heading}: message types in docs/protocol.md differ from the schema"
    for name, cls in classes.items():
        assert rows[name] == set(cls.model_fields) - common, f"`{name}` fields: docs vs schema"


def test_protocol_limits_errors_and_warnings_match():
    limits = {first_code(r[0]) for r in rows_with_header("`limits` field")}
    assert limits == set(protocol.Limits.model_fields), "`limits` fields: docs vs schema"
    errors = {first_code(r[0]): (r[1], r[2]) for r in table_after("Errors and close codes")}
    assert set(errors) == set(protocol.ERRORS), "error codes: docs/protocol.md vs server/protocol.py ERRORS"
    for code, (fatal, close, _) in protocol.ERRORS.items():
        assert errors[code] == ("yes" if fatal else "no", str(close) if close else ""), code
    warnings = {first_code(r[0]) for r in rows_with_header("Warning code")}
    assert warnings == set(protocol.WARNINGS), "warning codes: docs vs server/protocol.py WARNINGS"


def rows_with_header(first_header: str, page=PROTOCOL) -> list[list[str]]:
    """The body rows of the markdown table on `page` whose header starts with `first_header`."""
    lines = page.read_text(encoding="utf-8").splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith("| " + first_header))
    rows = []
    while i < len(lines) and lines[i].startswith("|"):
        rows.append([c.strip() for c in lines[i].strip().strip("|").split("|")])
        i += 1
    return rows[2:]


def test_protocol_example_validates():
    code, _ = blocks_and_prose(PROTOCOL.read_text(encoding="utf-8"))
    sent = [line[1:].strip() for _, line in code if line.startswith("→")]
    received = [json.loads(line[1:]) for _, line in code if line.startswith("←")]
    assert len(sent) >= 4 and len(received) >= 4
    for text in sent:
        protocol.parse_client_message(text)  # raises ProtocolError if the docs show an invalid message
    for msg in received:
        protocol.server_adapter.validate_python(msg)
    words = [m["text"] for m in received if m["type"] == "word"]
    assert [m["seq"] for m in received if m["type"] == "word"] == list(range(len(words)))
    sentence = next(m for m in received if m["type"] == "sentence")
    assert " ".join(words) == sentence["translation"] and len(sentence["delays"]) == len(words)


# ---------------------------------------------------------------- README and --help
def test_readme_is_short_and_shows_the_minimal_clients():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200   # a manual: history is in docs/history.md
    for name in ("stream.py", "stream.html"):
        example = (ROOT / "docs" / "examples" / name).read_text(encoding="utf-8").strip()
        assert example in text, f"README.md does not show docs/examples/{name} as it is (the tested copy)"


def subparsers(parser):
    return next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_subcommand_has_a_description_and_a_working_example(name):
    action = subparsers(build_parser([name]))
    helps = {a.dest: a.help for a in action._choices_actions}
    assert helps[name] == COMMANDS[name][1], "the module's help= and clients/cli.py's summary differ"
    parsers = [action.choices[name]]
    if name == "bench":
        parsers += list(subparsers(parsers[0]).choices.values())
    for p in parsers:
        assert p.description and "\n" not in p.description.strip(), f"{p.prog}: no one-line description"
        assert p.epilog and "example" in p.epilog, f"{p.prog}: no example in --help"
        examples = [argv for line in p.epilog.splitlines() for argv in simulserve_argvs(line)]
        assert examples, f"{p.prog}: the epilog shows no simulserve command"
        for argv in examples:
            assert parse_error(argv) is None, f"{p.prog} example `simulserve {' '.join(argv)}`: {parse_error(argv)}"
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as e:
        main([name, "--help"])
    assert e.value.code == 0 and "example" in out.getvalue()


def test_no_arguments_lists_every_subcommand_without_importing_them():
    code = "import sys; from clients.cli import main; rc = main([]); print('fastapi' in sys.modules, rc)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    lines = out.stdout.splitlines()
    for name, (_, summary) in COMMANDS.items():
        assert sum(1 for line in lines if line.split()[:1] == [name] and line.strip().endswith(summary)) == 1
    assert lines[-1] == "False 2", "listing the subcommands should not import the server (FastAPI)"


# ---------------------------------------------------------------- the README's figures and examples
def test_readme_model_table_matches_the_results():
    """Each BLEU / AL cell of the README's model table equals docs/results/results.csv (rounded)."""
    import csv
    rows = list(csv.DictReader(open(ROOT / "docs" / "results" / "results.csv", encoding="utf-8")))
    setting_of = {"δ = 1": "delta=1", "δ = 2": "delta=2", "k = 3": "k=3", "k = 5": "k=5",
                  "greedy": "offline", "beam 5": "offline beam=5"}
    # the set of each column from its header ("everyday (260) BLEU / AL", "unseen (1,317) ...")
    set_of = {"everyday": "test.everyday", "unseen": "test.unseen", "dialogue": "test.dialogue",
              "bible": "test.bible", "debian": "test.ddtp", "libreoffice": "test.libreoffice"}
    header = next(line for line in README.read_text(encoding="utf-8").splitlines()
                  if line.startswith("| model | policy, setting"))
    sets = [set_of[c.split()[0].lower()] for c in header.strip().strip("|").split("|")[2:]]
    assert {"test.everyday", "test.dialogue", "test.bible", "test.ddtp", "test.libreoffice"} <= set(sets)
    table = rows_with_header("model | policy, setting", README)
    assert len(table) >= 5   # GMA δ=1, wait-k k=3 and 5, offline greedy and beam 5
    for model, setting, *cells in table:
        model = first_code(model)
        key = next(v for k, v in setting_of.items() if setting.endswith(k))
        assert len(cells) == len(sets), cells
        for set_name, cell in zip(sets, cells):
            row = next(r for r in rows if r["set"] == set_name and r["model"] == model and r["setting"] == key)
            assert cell == f"{float(row['BLEU']):.2f} / {float(row['AL']):.2f}", (model, setting, set_name)


def test_readme_translations_are_what_the_shipped_models_write():
    """The README's example table (recipes/example_table.py): one column per shipped policy."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("example_table", ROOT / "recipes" / "example_table.py")
    example_table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example_table)
    lines = README.read_text(encoding="utf-8").splitlines()
    header = [c.strip() for c in next(line for line in lines if line.startswith("| German |")).strip("|").split("|")]
    assert header[1:] == list(example_table.COLUMNS), header
    rows = rows_with_header("German |", README)
    assert len(rows) >= 6
    got = example_table.translations([row[0] for row in rows])
    for column, header in enumerate(example_table.COLUMNS, start=1):
        assert got[header] == [row[column].replace("\\|", "|") for row in rows], header


def test_models_import_nothing_above_them():
    """docs/architecture.md: the layers only point downwards; models/ imports nothing from server/,
    agents/ or clients/ (not even lazily inside a function)."""
    import ast
    bad = []
    for path in sorted((ROOT / "models").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            bad += [f"{rel(path)}:{node.lineno}: {n}" for n in names
                    if n.split(".")[0] in ("server", "agents", "clients")]
    assert not bad, "models/ imports from a higher layer:\n" + "\n".join(bad)


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", page.read_text(encoding="utf-8"), re.M | re.S)


@pytest.mark.parametrize("page", [p for p in PAGES if p != README and python_blocks(p)], ids=lambda p: p.name)
def test_python_examples_run_and_show_their_values(page):
    """Every Python block of docs/ runs; a line `expression  # 3.214...` shows the value it evaluates to."""
    for block in python_blocks(page):
        namespace: dict = {}
        exec(compile(block, str(page), "exec"), namespace)
        for line in block.splitlines():
            m = re.match(r"^([\w.]+(?:\(\))?)\s+#\s+(-?\d+\.\d+)", line)
            if m:
                shown = m.group(2)
                assert f"{eval(m.group(1), namespace):.{len(shown.split('.')[1])}f}" == shown, line
