"""Run by ``test_hostile_tenant.py``'s loopback-only netns test, inside that namespace (``unshare -n``):
with the chart's defaults a tenant's internal URLs are refused with zero connections. Not a
``test_*.py`` file: pytest collects it only when its path is given, as that test does."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_hostile_tenant import (
    FIELD,
    NETNS_ADDRESSES,
    NETNS_ENV,
    _api_server_endpoint,
    _bracket,
    _profile,
    _tenant_kubeconfig,
)
from tests.support.operator_harness import OperatorProcess, condition, install_chart, profile_of, wait_for
from tests.support.procs import Listener


def test_inside_the_netns_internal_urls_are_refused_with_zero_connections(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    assert os.environ.get(NETNS_ENV) == "1", f"run by {__name__}'s caller inside its netns only"
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    assert [line.split(":")[1].strip() for line in links.splitlines()] == ["lo"], links
    cp = request.getfixturevalue("control_plane")
    ns = request.getfixturevalue("kube_namespace")
    system_namespace = request.getfixturevalue("system_namespace")
    listeners = [Listener(a) for a in NETNS_ADDRESSES]
    local = Listener("127.0.0.1")
    try:
        chart = install_chart(cp, system_namespace, {"operator": {"watchNamespace": ns}})  # the defaults
        tenant = _tenant_kubeconfig(cp, ns)
        urls: dict[str, tuple[str, Listener | None]] = {
            f"internal-{i}": (f"http://{_bracket(lst.host)}:{lst.port}/", lst)
            for i, lst in enumerate(listeners)
        }
        urls["v4compat"] = (f"http://[::169.254.169.254]:{listeners[1].port}/", listeners[1])
        urls["loopback"] = (f"http://127.0.0.1:{local.port}/", local)
        urls["apiserver-endpoint"] = (f"https://{_api_server_endpoint(cp)}/", None)
        urls["public"] = ("http://prometheus.example.com:9090/", None)
        op = OperatorProcess(
            cp,
            tmp_path,
            namespace=ns,
            operator_namespace=chart.namespace,
            kubeconfig=chart.kubeconfig,
            webhook=False,
            env=chart.env(),
        )
        try:
            op.start()
            for name, (url, _) in urls.items():
                cp.kubectl("apply", "-n", ns, "-f", "-", input=_profile(name, url), kubeconfig=tenant)
            for name in urls:

                def invalid(name: str = name) -> dict[str, Any] | None:
                    cond = condition(profile_of(cp, ns, name), "SpecValid")
                    return cond if cond and cond.get("status") == "False" else None

                message = str(wait_for(invalid, 60, f"SpecValid=False on {name}").get("message"))
                assert FIELD in message and "operator.prometheus.url" in message, (name, message)
                assert "operator.prometheus.allowedUrlPrefixes" in message, (name, message)
            time.sleep(6)  # another window: still nothing
            op.assert_alive()
        finally:
            op.close()
        assert {lst.host: lst.connections for lst in [*listeners, local]} == dict.fromkeys(
            [*NETNS_ADDRESSES, "127.0.0.1"], 0
        )
    finally:
        for lst in [*listeners, local]:
            lst.close()
