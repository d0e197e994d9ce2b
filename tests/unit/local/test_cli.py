"""The ``dam`` entry point hands each subcommand's arguments to that subcommand's ``main``."""

from __future__ import annotations

import importlib

import pytest

from dam_operator import cli

SUBCOMMANDS = {
    "run": "dam_operator.local.run",
    "tune": "dam_operator.local.tune",
    "evaluate": "dam_operator.local.evaluate",
    "sidecar": "dam_sidecar.app",
    "operator": "dam_operator.cluster.runtime.main",
    "probe-install": "dam_probe.bootstrap",
}


@pytest.mark.parametrize(("command", "module"), sorted(SUBCOMMANDS.items()))
def test_each_subcommand_runs_its_modules_main_with_the_rest_of_the_line(
    command: str, module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[list[str]] = []

    def fake_main(argv: list[str]) -> int:
        seen.append(argv)
        return 7

    monkeypatch.setattr(importlib.import_module(module), "main", fake_main)
    assert cli.main([command, "--json", "x"]) == 7
    assert seen == [["--json", "x"]]


def test_the_usage_names_every_subcommand_and_an_unknown_one_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main([]) == 0
    usage = capsys.readouterr().out
    assert all(f"\n  {command} " in usage for command in SUBCOMMANDS)
    assert cli.main(["frobnicate"]) == 2
    assert capsys.readouterr().err == f"dam: unknown command 'frobnicate'\n\n{cli.USAGE}"
