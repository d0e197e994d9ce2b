"""The image's install steps, reproduced without a Docker engine.

Like the Dockerfile: the build context is only what the Dockerfile COPYs (read from
it), the wheel is built from that copy with ``pip wheel``, and a fresh virtual
environment gets the wheel with ``pip install --no-index --no-cache-dir``. Then every
entry point the chart and the webhook use runs, as the image's user (65532) when this
test runs as root.

One compromise, to stay offline and fast: the wheel goes in with ``--no-deps``, and
its dependencies (the closure of its ``Requires-Dist``) are copied file by file from
this test's own environment into a directory beside the fresh environment, reached
through a ``.pth`` line appended *after* its site-packages. A copy, not a path into
the test's environment: that environment lives in the clone, and a clone in a private
directory (``/root``, any 0700 parent) is unreadable for the image's user. The package
itself is only importable from the wheel (the test checks where it is imported from),
and every ``Requires-Dist`` of the wheel is checked to be satisfied.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
IMAGE_UID = IMAGE_GID = 65532
SETPRIV = shutil.which("setpriv")

pytestmark = pytest.mark.slow


def _run(
    cmd: list[str], env: dict[str, str] | None = None, cwd: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240, check=False, env=env, cwd=cwd)


def _copied_paths() -> list[str]:
    """Sources of the Dockerfile's COPY instructions that read the build context."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    paths: list[str] = []
    for line in text.splitlines():
        words = line.split()
        if words and words[0] == "COPY" and not any(w.startswith("--from") for w in words):
            paths.extend(w.rstrip("/") for w in words[1:-1] if not w.startswith("--"))
    return paths


def _as_image_user() -> list[str]:
    return (
        [SETPRIV, "--reuid", str(IMAGE_UID), "--regid", str(IMAGE_GID), "--clear-groups"] if SETPRIV else []
    )


def _interpreters() -> list[str]:
    """Python 3.11 interpreters to build the environment on; the running one's base first."""
    found = [getattr(sys, "_base_executable", sys.executable)]
    found += [p for p in ("/usr/local/bin/python3.11", "/usr/bin/python3.11") if os.path.exists(p)]
    return list(dict.fromkeys(found))


def _runs_as_image_user(python: str) -> bool:
    if os.geteuid() != 0 or not SETPRIV:
        return False
    probe = _run([*_as_image_user(), python, "-c", "import sys; print(sys.version_info[:2])"])
    return probe.returncode == 0 and probe.stdout.strip() == str(tuple(sys.version_info[:2]))


def _requirements_of(requires: list[str] | None) -> list[str]:
    names = []
    for spec in requires or []:
        req = Requirement(spec)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            names.append(req.name)
    return names


def _dependency_closure(wheel: Path) -> set[str]:
    """Distribution names the wheel needs at run time, transitively, as installed here."""
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        text = zf.read(meta).decode()
    todo = _requirements_of(
        [ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("Requires-Dist:")]
    )
    seen: set[str] = set()
    while todo:
        name = todo.pop().lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        todo.extend(_requirements_of(md.distribution(name).requires))
    return seen


def _copy_distributions(names: set[str], dest: Path) -> None:
    """Copies each distribution's files (those under its site-packages) into ``dest``."""
    for name in names:
        dist = md.distribution(name)
        root = Path(str(dist.locate_file(""))).resolve()
        for rel in dist.files or []:
            src = Path(str(dist.locate_file(rel))).resolve()
            if not src.is_file() or not src.is_relative_to(root) or "__pycache__" in src.parts:
                continue  # console scripts in bin/, byte code
            target = dest / src.relative_to(root)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)


@dataclass
class Image:
    venv: Path
    wheel: Path
    prefix: list[str]  # runs a command as the image's user, or [] when that is impossible
    why_not_image_user: str


@pytest.fixture(scope="module")
def image() -> Iterator[Image]:
    # Not pytest's tmp_path: its parent is private to root, and the image user must read the venv.
    base = Path(tempfile.mkdtemp(prefix="dam-image-"))
    try:
        base.chmod(0o755)
        context = base / "context"
        context.mkdir()
        for rel in _copied_paths():
            src = ROOT / rel
            if src.is_dir():
                shutil.copytree(
                    src, context / rel, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
                )
            else:
                shutil.copy2(src, context / rel)
        wheels = base / "wheels"
        built = _run(
            [
                *(
                    sys.executable,
                    "-m",
                    "pip",
                    "wheel",
                    "--no-deps",
                    "--no-build-isolation",
                    "--no-cache-dir",
                ),
                *("--wheel-dir", str(wheels), str(context)),
            ]
        )
        assert built.returncode == 0, built.stdout + built.stderr
        (wheel,) = wheels.glob("dam_operator-*.whl")

        candidates = _interpreters()
        usable = [p for p in candidates if _runs_as_image_user(p)]
        python = (usable or candidates)[0]
        if usable:
            why = ""
        elif os.geteuid() != 0:
            why = "the test does not run as root, so it cannot switch to the image user"
        elif not SETPRIV:
            why = "setpriv (util-linux) is missing"
        else:
            why = f"user {IMAGE_UID} cannot execute any Python 3.11 here ({candidates})"

        venv = base / "venv"
        made = _run([python, "-m", "venv", "--without-pip", str(venv)])
        assert made.returncode == 0, made.stderr
        installed = _run(
            [
                *(sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install"),
                *("--no-deps", "--no-index", "--no-cache-dir", str(wheel)),
            ]
        )
        assert installed.returncode == 0, installed.stdout + installed.stderr
        site = Path(
            _run(
                [
                    str(venv / "bin" / "python"),
                    "-c",
                    "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                ]
            ).stdout.strip()
        )
        # Dependencies only (see the module docstring); "zz" sorts after anything the wheel adds.
        deps = base / "deps"
        _copy_distributions(_dependency_closure(wheel) | {"packaging"}, deps)
        (site / "zz-dependencies.pth").write_text(f"{deps}\n")
        for path in [base, *base.rglob("*")]:
            mode = path.stat().st_mode
            path.chmod(
                mode | stat.S_IRGRP | stat.S_IROTH | (stat.S_IXGRP | stat.S_IXOTH if path.is_dir() else 0)
            )
        yield Image(venv=venv, wheel=wheel, prefix=_as_image_user() if usable else [], why_not_image_user=why)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _dam(image: Image, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": f"{image.venv / 'bin'}:/usr/bin:/bin",
        "HOME": "/tmp",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
    }
    return _run([*image.prefix, str(image.venv / "bin" / "dam"), *args], env=env, cwd="/")


def test_wheel_carries_every_package_and_the_dam_command(image: Image) -> None:
    with zipfile.ZipFile(image.wheel) as wheel:
        names = wheel.namelist()
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        assert "dam = dam_operator.cli:main" in wheel.read(entry_points).decode()
    for module in (
        "dam_probe/__init__.py",
        "dam_probe/autoinstrument/sitecustomize.py",
        "dam_sidecar/app.py",
        "dam_contract/snapshot.py",
    ):
        assert module in names, module
    assert "dam_operator/cluster/runtime/main.py" in names
    assert not [n for n in names if n.startswith("tests/") or "__pycache__" in n]


def test_package_is_imported_from_the_wheel_and_its_requirements_are_met(image: Image) -> None:
    script = """
import importlib.metadata as md, dam_operator, dam_sidecar, dam_probe, dam_contract
from packaging.requirements import Requirement
for module in (dam_operator, dam_sidecar, dam_probe, dam_contract):
    print("FILE", module.__file__)
for spec in md.distribution("dam-operator").requires or []:
    req = Requirement(spec)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    version = md.version(req.name)
    print("REQ", req.name, version, req.specifier.contains(version, prereleases=True))
"""
    result = _run([*image.prefix, str(image.venv / "bin" / "python"), "-c", script], cwd="/")
    assert result.returncode == 0, result.stderr
    files = [ln.split(" ", 1)[1] for ln in result.stdout.splitlines() if ln.startswith("FILE ")]
    assert len(files) == 4 and all(f.startswith(str(image.venv)) for f in files), files
    requirements = [ln.split() for ln in result.stdout.splitlines() if ln.startswith("REQ ")]
    assert {r[1].lower() for r in requirements} >= {"kopf", "prometheus-client", "pydantic"}
    assert [r for r in requirements if r[3] != "True"] == []


def test_runs_as_the_image_user_when_possible(image: Image) -> None:
    if not image.prefix:
        pytest.skip(f"cannot run as uid {IMAGE_UID}: {image.why_not_image_user}")
    result = _run([*image.prefix, str(image.venv / "bin" / "python"), "-c", "import os; print(os.getuid())"])
    assert result.stdout.strip() == str(IMAGE_UID)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--help"], "usage: dam"),
        (["sidecar", "--help"], "dam sidecar"),
        (["operator", "--help"], "dam operator"),
    ],
    ids=["dam", "sidecar", "operator"],
)
def test_entrypoint_answers_help(image: Image, args: list[str], expected: str) -> None:
    result = _dam(image, *args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert expected in result.stdout


def test_probe_install_fills_the_shared_volume(image: Image) -> None:
    volume = Path(tempfile.mkdtemp(prefix="dam-probe-volume-"))
    try:
        if image.prefix:
            os.chown(volume, IMAGE_UID, IMAGE_GID)  # an emptyDir owned by the pod's fsGroup
        result = _dam(image, "probe-install", str(volume))
        assert result.returncode == 0, result.stdout + result.stderr
        assert (volume / "sitecustomize.py").read_text().startswith("# dam-probe sitecustomize")
        assert (volume / "dam_probe" / "__init__.py").is_file()
        if image.prefix:
            assert (volume / "sitecustomize.py").stat().st_uid == IMAGE_UID
        # The training container needs nothing but PYTHONPATH: a bare interpreter imports the probe.
        bare = _run(
            [
                *image.prefix,
                str(image.venv / "bin" / "python"),
                "-I",
                "-S",
                "-c",
                f"import sys; sys.path.insert(0, {str(volume)!r}); import dam_probe",
            ]
        )
        assert bare.returncode == 0, bare.stderr
    finally:
        shutil.rmtree(volume, ignore_errors=True)


def test_probe_install_into_an_unwritable_directory_fails_clearly(image: Image) -> None:
    if not image.prefix:
        pytest.skip(f"needs the image user to meet a root-owned directory: {image.why_not_image_user}")
    volume = Path(tempfile.mkdtemp(prefix="dam-probe-readonly-"))
    try:
        volume.chmod(0o755)  # root-owned: the image user cannot write
        result = _dam(image, "probe-install", str(volume))
        assert result.returncode != 0
        assert "Traceback" not in result.stderr
        assert str(volume) in result.stderr
    finally:
        shutil.rmtree(volume, ignore_errors=True)
