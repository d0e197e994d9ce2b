"""``dam probe-install DIR``: copying the instrumentation, and its errors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dam_probe.bootstrap import SITECUSTOMIZE_MARKER, InstallError, install_into, main

from .conftest import python_env, run_python


def test_install_copies_the_package_and_sitecustomize_so_pythonpath_is_enough(tmp_path: Path) -> None:
    target = install_into(str(tmp_path / "site"))
    assert target == str(tmp_path / "site")
    files = {str(p.relative_to(target)) for p in Path(target).rglob("*") if p.is_file()}
    assert {"sitecustomize.py", "dam_probe/__init__.py", "dam_probe/layout.py", "dam_probe/_core.py"} <= files
    assert not any("__pycache__" in f or f.endswith(".tmp") for f in files)
    result = run_python(
        "import dam_probe, sitecustomize; print(dam_probe.__file__); print(sitecustomize.__file__)",
        python_env(PYTHONPATH=target),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [f"{target}/dam_probe/__init__.py", f"{target}/sitecustomize.py"]


def test_installing_twice_refreshes_the_files(tmp_path: Path) -> None:
    target = install_into(str(tmp_path))
    layout = Path(target, "dam_probe", "layout.py")
    layout.write_text("broken")
    install_into(str(tmp_path))
    assert layout.read_text() != "broken"


def test_install_refuses_to_overwrite_a_foreign_sitecustomize(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text("print('mine')\n")
    with pytest.raises(InstallError, match="exists and is not dam-probe's"):
        install_into(str(tmp_path))
    assert (tmp_path / "sitecustomize.py").read_text() == "print('mine')\n"


def test_cli_installs_and_exits_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "d")]) == 0
    out = capsys.readouterr().out
    assert f"PYTHONPATH={tmp_path / 'd'}" in out
    assert (tmp_path / "d" / "sitecustomize.py").read_text().startswith(SITECUSTOMIZE_MARKER)


def test_cli_rejects_a_file_as_directory_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "file"
    target.write_text("")
    assert main([str(target)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dam probe-install: error: ")
    assert "is not a directory" in err
    assert "Traceback" not in err


def test_cli_reports_an_unwritable_directory_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main([str(blocker / "sub" / "dir")]) == 2
    assert "dam probe-install: error: cannot write" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [[], ["a", "b"], [""]])
def test_cli_rejects_bad_arguments_with_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "usage: dam probe-install" in capsys.readouterr().err


def test_installed_files_are_readable_by_everyone(tmp_path: Path) -> None:
    target = install_into(str(tmp_path))
    mode = os.stat(os.path.join(target, "sitecustomize.py")).st_mode & 0o777
    assert mode == 0o644
