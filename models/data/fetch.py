"""Fetch the corpora's packages through the machine's own pip and apt setup.

No host name appears here on purpose: pip and apt already know which index or
mirror this machine (or an air-gapped box's local mirror) uses. Every helper
returns None / an empty result and prints a warning instead of raising, so one
missing source never stops the others.
"""
from __future__ import annotations

import io
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path


def warn(msg: str) -> None:
    print("warning: " + msg, file=sys.stderr, flush=True)


def _run(cmd: list[str], cwd: Path | None = None) -> bool:
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    except OSError as e:
        warn("%s: %s" % (cmd[0], e))
        return False
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        warn("`%s` failed (exit %d): %s" % (" ".join(cmd), proc.returncode, " | ".join(tail)))
        return False
    return True


def pip_download(requirement: str, dest: Path) -> Path | None:
    """`pip download --no-deps REQ` into dest; reuse a wheel already there."""
    name, _, version = requirement.partition("==")
    pattern = "%s-%s-*.whl" % (name.replace("-", "_"), version or "*")
    dest.mkdir(parents=True, exist_ok=True)
    found = sorted(dest.glob(pattern))
    if not found:
        print("downloading %s with pip ..." % requirement, flush=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", requirement, "-d", str(dest)]
        if not _run(cmd):
            return None
        found = sorted(dest.glob(pattern))
    if not found:
        warn("pip reported success but no %s in %s" % (pattern, dest))
        return None
    return found[-1]


def have_apt() -> bool:
    return shutil.which("apt-get") is not None


def apt_download(packages: list[str], dest: Path) -> dict[str, Path]:
    """`apt-get download` each package into dest; reuse .deb files already there."""
    dest.mkdir(parents=True, exist_ok=True)
    debs: dict[str, Path] = {}
    for pkg in packages:
        found = sorted(dest.glob(pkg + "_*.deb"))
        if not found:
            if not have_apt():
                warn("apt-get not found: cannot fetch %s" % pkg)
                continue
            print("downloading %s with apt-get ..." % pkg, flush=True)
            _run(["apt-get", "download", "-q", pkg], cwd=dest)
            found = sorted(dest.glob(pkg + "_*.deb"))
        if found:
            debs[pkg] = found[-1]
        else:
            warn("could not download Debian package %s" % pkg)
    return debs


def deb_version(deb: Path) -> str:
    """Version from the file name apt-get gives: name_EPOCH%3aVERSION_arch.deb."""
    return deb.name.split("_")[1].replace("%3a", ":")


def extract_deb(deb: Path, dest: Path) -> None:
    """Unpack a .deb's data archive without dpkg (a .deb is an `ar` archive)."""
    data = deb.read_bytes()
    if not data.startswith(b"!<arch>\n"):
        raise ValueError("%s is not a Debian package" % deb)
    pos = 8
    while pos + 60 <= len(data):
        header = data[pos:pos + 60]
        name = header[:16].decode().strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        body = data[pos + 60:pos + 60 + size]
        if name.startswith("data.tar"):
            if name.endswith(".zst"):
                # tarfile cannot read zstd before Python 3.14: fall back to dpkg-deb
                subprocess.run(["dpkg-deb", "-x", str(deb), str(dest)], check=True)
                return
            with tarfile.open(fileobj=io.BytesIO(body), mode="r:*") as tar:
                tar.extractall(dest, filter="data")
            return
        pos += 60 + size + (size & 1)
    raise ValueError("no data archive in %s" % deb)


def apt_translations(workdir: Path, languages: tuple[str, ...] = ("de", "en"),
                     refresh: bool = False) -> dict[str, list[Path]]:
    """Fetch the apt `Translation-<lang>` index files into a private lists dir.

    The system's sources list is reused, but lists and cache live under
    workdir, so the machine's own apt state is never touched. Returns
    {lang: [files]}; reuses earlier files unless refresh.
    """
    lists = workdir / "lists"
    found = _translation_files(lists, languages)
    if all(found.values()) and not refresh:
        return found
    if not have_apt():
        warn("apt-get not found: skipping the Debian package descriptions")
        return {lang: [] for lang in languages}
    (lists / "partial").mkdir(parents=True, exist_ok=True)
    (workdir / "cache" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
    cmd = ["apt-get", "update", "-q",
           "-o", "Dir::State::Lists=%s" % lists.resolve(),
           "-o", "Dir::Cache=%s" % (workdir / "cache").resolve(),
           # A scalar Acquire::Languages (e.g. Docker's "none") wins over a
           # list, so blank it first, then give the list.
           "-o", "Acquire::Languages=",
           "-o", "Acquire::GzipIndexes=false"]
    for lang in languages:
        cmd += ["-o", "Acquire::Languages::=%s" % lang]
    print("fetching apt Translation-%s index files ..." % "/".join(languages), flush=True)
    _run(cmd)
    found = _translation_files(lists, languages)
    for lang, files in found.items():
        if not files:
            warn("no Translation-%s file came with `apt-get update`" % lang)
    return found


def _translation_files(lists: Path, languages: tuple[str, ...]) -> dict[str, list[Path]]:
    out: dict[str, list[Path]] = {}
    for lang in languages:
        files = [p for p in lists.glob("*_i18n_Translation-%s*" % lang) if p.is_file()]
        out[lang] = sorted(files)
    return out
