"""Read-only build mounts that give pip inside an image build this machine's pip configuration.

Prints one `--volume=SRC:DST:ro` argument per line for `podman build` (docker/podman.sh): a pip.conf
merged from every configuration pip on this machine reads (files and PIP_* variables, the variables
winning, as for pip itself) mounted at /etc/pip.conf, and every local file or folder that configuration
names (wheel folders, file:// indexes, constraint files, CA bundles) at the same path. Nothing is
written into the image: the mounts exist only while a RUN step runs. Index addresses stay where the
machine's configuration keeps them; this script never names one.

    python3 docker/pip-mounts.py [--out DIR]      # DIR holds the merged pip.conf (default ~/.cache/simulserve)
"""
from __future__ import annotations

import argparse
import ast
import configparser
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit


def pip_settings() -> dict[str, dict[str, str]]:
    """{section: {key: value}} as `pip config list` reports them; environment variables in section ':env:'."""
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True)
    settings: dict[str, dict[str, str]] = {}
    for line in out.stdout.splitlines():
        name, sep, value = line.partition("=")
        if not sep:
            continue
        section, _, key = name.rpartition(".")
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            pass
        settings.setdefault(section, {})[key] = str(value)
    return settings


def merged_config(settings: dict[str, dict[str, str]]) -> configparser.ConfigParser:
    env = settings.pop(":env:", {})
    conf = configparser.ConfigParser(interpolation=None)
    for section, values in settings.items():
        conf[section] = {k: v for k, v in values.items() if k not in env}
    if env:
        conf["global"] = {**(conf["global"] if conf.has_section("global") else {}), **env}
    return conf


def local_paths(conf: configparser.ConfigParser) -> list[Path]:
    """Existing local files and folders named by the configuration (plain paths and file:// URLs)."""
    paths = []
    for section in conf.sections():
        for value in conf[section].values():
            for token in value.split():
                if token.startswith("file://"):
                    token = unquote(urlsplit(token).path).rstrip("/")
                    # a PEP 503 index's pages link to files beside it (../../files/...): mount its root
                    if token.endswith("/simple"):
                        token = os.path.dirname(token)
                if token.startswith("/") and os.path.exists(token):
                    paths.append(Path(token))
    # a folder already mounted covers what lies inside it
    keep = sorted(set(paths), key=lambda p: len(p.parts))
    out: list[Path] = []
    for p in keep:
        if not any(p == q or q in p.parents for q in out):
            out.append(p)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("SIMULSERVE_CACHE",
                                                    Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
                                                    / "simulserve"))
    args = ap.parse_args()
    conf = merged_config(pip_settings())
    if not conf.sections():
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "pip.conf", "w") as f:
        conf.write(f)
    print(f"--volume={out / 'pip.conf'}:/etc/pip.conf:ro")
    for p in local_paths(conf):
        print(f"--volume={p}:{p}:ro")
    return 0


if __name__ == "__main__":
    sys.exit(main())
