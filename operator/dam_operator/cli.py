"""The ``dam`` command line: one entry point, a subcommand per role.

Each subcommand's module is imported only when it runs, so ``dam run`` never
pays for kopf and ``dam sidecar`` never imports the operator.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence

USAGE = """usage: dam <command> [options]

commands:
  run [--interval S] [--window S] [--json] -- CMD ...   diagnose a local training command
  tune [--budget S] [--window S] [--json] -- CMD ...    tune an input-bound command's DataLoader
  evaluate BEFORE.prom AFTER.prom [--json] [--gpu-model M]   verdict from two metric snapshots
  sidecar [--port 9450] [--interval S]                  serve /metrics next to a training container
  operator [kopf run options]                           the Kubernetes operator
  probe-install DIR                                     copy the automatic instrumentation into DIR

Run `dam <command> --help` for the options of one command.
"""


COMMANDS: dict[str, str] = {
    "run": "dam_operator.local.run",
    "tune": "dam_operator.local.tune",
    "evaluate": "dam_operator.local.evaluate",
    "sidecar": "dam_sidecar.app",
    "operator": "dam_operator.cluster.runtime.main",
    "probe-install": "dam_probe.bootstrap",
}
"""Each subcommand's module; its ``main(argv: list[str]) -> int`` runs it."""


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        sys.stdout.write(USAGE)
        return 0
    command, rest = args[0], args[1:]
    module = COMMANDS.get(command)
    if module is None:
        sys.stderr.write(f"dam: unknown command {command!r}\n\n{USAGE}")
        return 2
    run: Callable[[list[str]], int] = importlib.import_module(module).main
    return run(rest)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
