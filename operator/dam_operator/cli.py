"""The ``dam`` command line: one entry point, a subcommand per role.

Each subcommand's module is imported only when it runs, so ``dam run`` never
pays for kopf and ``dam sidecar`` never imports the operator.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

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


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        sys.stdout.write(USAGE)
        return 0
    command, rest = args[0], args[1:]
    if command == "run":
        from dam_operator.local.run import main as run_main

        return run_main(rest)
    if command == "tune":
        from dam_operator.local.tune import main as tune_main

        return tune_main(rest)
    if command == "evaluate":
        from dam_operator.local.evaluate import main as evaluate_main

        return evaluate_main(rest)
    if command == "sidecar":
        from dam_sidecar.app import main as sidecar_main

        return sidecar_main(rest)
    if command == "operator":
        from dam_operator.cluster.runtime.main import main as operator_main

        return operator_main(rest)
    if command == "probe-install":
        from dam_probe.bootstrap import main as install_main

        return install_main(rest)
    sys.stderr.write(f"dam: unknown command {command!r}\n\n{USAGE}")
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
