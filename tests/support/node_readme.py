"""README.md's Kubernetes block (marked ``<!-- readme-test: kubernetes -->``) on the node tier, run as
written: where each of its commands runs, and the few the tier substitutes.

The block is cut where it changes hands, so that the README's commands are the tier's own set-up and
add no time of their own (the scenarios run side by side: tests/integration/node/conftest.py):

- **install** (``kubectl create namespace dam-system`` .. ``kubectl -n dam-system rollout status``): the
  tier's operator, once (``operator_installed``): every scenario of the tier runs on the operator the
  README installs, with the ``helm`` of ``make tools``;
- **job** (``kubectl apply -f examples/damprofile.yaml`` .. the ``kubectl create``/``apply`` of the
  example Job): by the ``scenarios`` fixture, in the "readme" scenario's namespace, when the other
  scenarios' Jobs are created;
- **watch** (the verdict's ``kubectl wait`` and ``kubectl get damp``): by the test
  (tests/integration/node/test_readme_kubernetes.py), which then reads the status.

Every part runs after the block's ``export`` lines (``export PATH="$(make -s tools | tail -n 1):$PATH"``
as written: the tools must be built, ``make tools``; the tier skips, or fails with ``CI=true``, when
they are not). Substituted, and nothing else:

- ``make cluster``: not run; the session's node (fixture ``node_cluster``) is the same one-node
  cluster ``make cluster`` starts (tools/node/dam_cluster), in the test's own directory instead of
  /var/lib/dam-node;
- ``export KUBECONFIG=/var/lib/dam-node/admin.kubeconfig``: that node's admin kubeconfig (the same
  user and cluster); for the job and watch parts a copy whose context's namespace is the scenario's
  instead of ``default`` (the README's profile and Job name no namespace: they land in the
  kubeconfig's, here as for the user);
- the ``helm install`` line: as written, with the tier's own values appended (``TIER_HELM_SET``:
  what other scenarios need of the chart);
- ``make cluster-down``: not run; the fixture stops the node at the end of the session (what
  ``make cluster-down`` removes is tools/node's test).
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.support import readme
from tests.support.node_jobs import RELEASE, SYSTEM_NS, dump
from tests.support.nodecluster import NodeCluster

TOOLS_BUILD = readme.README.parent / "tools" / "kube-tools" / "build.sh"
TIER_HELM_SET = (
    # The "shared" scenario's profile asks for a shared process namespace, which the chart allows
    # only when the admin says so; no other profile of the tier asks, so none gets one.
    "--set sidecar.allowShareProcessNamespace=true"
    # The "stall" scenario's profile asks spec.actions.onStall: Restart; the operator deletes a
    # stalled job's Pods only where the chart grants it pods delete (off by default). Only that
    # profile asks, and the operator deletes only the Pods of a profile that asks.
    " --set rbac.stallRestart=true"
)
SKEW_WARNING = "version difference"  # kubectl's "WARNING: version difference between client (...) and server"

# Where the block changes hands (each must start exactly one of its commands).
FIRST = "export PATH="
INSTALL = "kubectl create namespace dam-system"
JOB = "kubectl apply -f examples/damprofile.yaml"
WATCH = "kubectl wait --for=jsonpath="
EXAMPLE_JOB = "train"  # examples/trainer-job.yaml's metadata.name


def _with_tier_values(helm_install: str) -> str:
    """The README's helm line with TIER_HELM_SET before a trailing comment, if any."""
    head, _, last = helm_install.rpartition("\n")
    m = re.fullmatch(r"(.*?)(\s+#[^\"']*)?", last, flags=re.DOTALL)
    assert m is not None
    last = f"{m[1]} {TIER_HELM_SET}{m[2] or ''}"
    return f"{head}\n{last}" if head else last


def steps(kubeconfig: Path) -> readme.Block:
    """The block with the tier's substitutions (module docstring), for ``kubeconfig``."""
    return readme.block("kubernetes").substituted(
        {
            "make cluster ": None,
            "export KUBECONFIG=": f"export KUBECONFIG={shlex.quote(str(kubeconfig))}",
            "helm install dam-operator ": _with_tier_values,
            "make cluster-down": None,
        }
    )


def prelude(kubeconfig: Path) -> readme.Block:
    return steps(kubeconfig).between(FIRST, INSTALL)


def install_part(kubeconfig: Path) -> readme.Block:
    return steps(kubeconfig).between(INSTALL, JOB)


def job_part(kubeconfig: Path) -> readme.Block:
    return steps(kubeconfig).between(JOB, WATCH)


def watch_part(kubeconfig: Path) -> readme.Block:
    return steps(kubeconfig).between(WATCH)


def run(part: readme.Block, kubeconfig: Path, timeout_s: float) -> str:
    """The prelude and ``part`` in one shell; what they printed (stdout, then stderr). Fails on
    kubectl's version-skew warning: the README's kubectl is the cluster's release."""
    done = readme.run([prelude(kubeconfig), part], timeout_s=timeout_s)
    out = f"{done.stdout}\n{done.stderr}"
    assert SKEW_WARNING not in out, f"kubectl warned of a version skew:\n{out}"
    return out


def kubeconfig_for(node: NodeCluster, namespace: str) -> Path:
    """A copy of the node's admin kubeconfig whose contexts default to ``namespace``."""
    config = yaml.safe_load(node.kubeconfig.read_text())
    for context in config.get("contexts") or ():
        context["context"]["namespace"] = namespace
    path = node.kubeconfig.parent / f"readme-{namespace}.kubeconfig"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path


def tools_missing() -> str | None:
    """Why the README's ``make -s tools`` would have to build (None: built, it only prints)."""
    done = subprocess.run(
        [str(TOOLS_BUILD), "--no-build"], capture_output=True, text=True, timeout=60, check=False
    )
    if done.returncode == 0:
        return None
    return (done.stderr.strip().splitlines() or [f"{TOOLS_BUILD} --no-build exited {done.returncode}"])[-1]


@contextlib.contextmanager
def operator_installed(node: NodeCluster) -> Iterator[NodeCluster]:
    """The README's install part on ``node``, as written; ``helm uninstall`` after."""
    missing = tools_missing()
    if missing:
        message = f"NO KUBECTL/HELM OF `make tools` for the README's commands: {missing}; run `make tools`"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    admin = node.kubeconfig
    try:
        run(install_part(admin), admin, timeout_s=400)
        yield node
    finally:
        if node.running:
            dump(node, SYSTEM_NS)
            uninstall = readme.Block("teardown", (f"helm uninstall {RELEASE} -n {SYSTEM_NS} --timeout 60s",))
            with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
                readme.run([prelude(admin), uninstall], timeout_s=90)
            node.kubectl("delete", "namespace", SYSTEM_NS, "--wait=false", check=False)
