"""Installs the automatic instrumentation into a directory: ``dam probe-install DIR``.

``install_into(DIR)`` copies the ``dam_probe`` package and its
``sitecustomize.py`` into ``DIR``; then ``PYTHONPATH=DIR`` (plus
``DAM_PROBE_DIR``) is all any Python needs to publish DataLoader counters.
The pod's init container runs this into a shared volume; ``dam run`` does it
into a temporary directory.

Also here for readers (the sidecar): ``probe_files`` and ``read_all``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Sequence
from typing import Final

from dam_probe.layout import ProbeScan, probe_files, read_all

__all__ = ["SITECUSTOMIZE_MARKER", "ProbeScan", "install_into", "main", "probe_files", "read_all"]

SITECUSTOMIZE_MARKER: Final = "# dam-probe sitecustomize"
PACKAGE_DIR: Final = os.path.dirname(os.path.abspath(__file__))
SITECUSTOMIZE_SOURCE: Final = os.path.join(PACKAGE_DIR, "autoinstrument", "sitecustomize.py")


class InstallError(Exception):
    """The instrumentation cannot be installed into the directory (message says why and what to do)."""


def _package_files() -> list[str]:
    """Paths of the package's files to copy, relative to the package directory."""
    out: list[str] = []
    for root, dirs, files in os.walk(PACKAGE_DIR):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
        for name in sorted(files):
            if name.endswith(".py") or name == "py.typed":
                out.append(os.path.relpath(os.path.join(root, name), PACKAGE_DIR))
    return out


def _copy(src: str, dst: str) -> None:
    """Copies through a temporary name so that a reader never imports a half-written file."""
    tmp = f"{dst}.{os.getpid()}.tmp"
    shutil.copyfile(src, tmp)
    os.chmod(tmp, 0o644)
    os.replace(tmp, dst)


def _is_ours(path: str) -> bool:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.readline().startswith(SITECUSTOMIZE_MARKER)
    except OSError:
        return False


def install_into(directory: str) -> str:
    """Copies ``dam_probe`` and ``sitecustomize.py`` into ``directory``; returns its absolute path.

    Idempotent (a second run refreshes the files). Refuses to overwrite a
    ``sitecustomize.py`` that is not dam-probe's. Raises ``InstallError``.
    """
    target = os.path.abspath(directory)
    if os.path.exists(target) and not os.path.isdir(target):
        raise InstallError(f"{target} exists and is not a directory; pass a directory")
    if not os.path.isfile(SITECUSTOMIZE_SOURCE):
        raise InstallError(f"{SITECUSTOMIZE_SOURCE} is missing: the dam_probe installation is incomplete")
    site = os.path.join(target, "sitecustomize.py")
    if os.path.exists(site) and not _is_ours(site):
        raise InstallError(
            f"{site} exists and is not dam-probe's; install into an empty directory "
            "(dam-probe's sitecustomize runs the next one on sys.path, so keep yours elsewhere on PYTHONPATH)"
        )
    try:
        os.makedirs(target, exist_ok=True)
        package = os.path.join(target, "dam_probe")
        for rel in _package_files():
            dst = os.path.join(package, rel)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            _copy(os.path.join(PACKAGE_DIR, rel), dst)
        _copy(SITECUSTOMIZE_SOURCE, site)
    except OSError as exc:
        where = exc.filename or target
        raise InstallError(f"cannot write {where}: {exc.strerror or exc}") from exc
    return target


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dam probe-install",
        description=(
            "Copy dam-probe's automatic DataLoader instrumentation into DIR. Then run training with "
            "PYTHONPATH=DIR and DAM_PROBE_DIR=<where probe files go>; DAM_PROBE_DISABLE=1 turns it off."
        ),
    )
    parser.add_argument("directory", metavar="DIR", help="directory to install into (created if missing)")
    parser.add_argument("--quiet", "-q", action="store_true", help="print nothing on success")
    return parser


def main(argv: Sequence[str]) -> int:
    """``dam probe-install DIR``: 0 on success, 2 on bad input or an unwritable directory."""
    parser = _parser()
    try:
        args = parser.parse_args(list(argv))
    except SystemExit as exc:  # argparse already printed usage and the error
        return exc.code if isinstance(exc.code, int) else 2
    if not str(args.directory).strip():
        parser.print_usage(sys.stderr)
        sys.stderr.write("dam probe-install: error: DIR must not be empty\n")
        return 2
    try:
        target = install_into(args.directory)
    except InstallError as exc:
        sys.stderr.write(f"dam probe-install: error: {exc}\n")
        return 2
    if not args.quiet:
        sys.stdout.write(f"installed dam-probe into {target}\nuse: PYTHONPATH={target} DAM_PROBE_DIR=<dir>\n")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
