"""README.md's Kubernetes block and the example Job it starts, without a cluster: what the node tier's
README test (tests/integration/node/test_readme_kubernetes.py) relies on to run the block as written,
and what a user relies on for the Job to be diagnosed (docs/install.md, "Your own training Job")."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import node_readme, pss, readme

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE_JOB = ROOT / "examples" / "trainer-job.yaml"


def _job() -> dict[str, Any]:
    job: dict[str, Any] = yaml.safe_load(EXAMPLE_JOB.read_text())
    return job


def _words(command: str) -> list[str]:
    return shlex.split(command.replace("\\\n", " "), comments=True)


def test_the_tier_finds_every_command_it_substitutes_and_every_cut_in_order(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "admin.kubeconfig"
    parts = [
        node_readme.prelude(kubeconfig),
        node_readme.install_part(kubeconfig),
        node_readme.job_part(kubeconfig),
        node_readme.watch_part(kubeconfig),
    ]
    whole = node_readme.steps(kubeconfig).commands
    assert sum((p.commands for p in parts), ()) == whole  # the parts cover the block, in order
    assert not any(c.startswith("make ") for c in whole), whole  # both make lines substituted
    (export,) = [c for c in whole if c.startswith("export KUBECONFIG=")]
    assert _words(export) == ["export", f"KUBECONFIG={kubeconfig}"]
    (helm,) = [c for c in whole if c.startswith("helm install")]
    tier = node_readme.TIER_HELM_SET.split()
    assert _words(helm)[-len(tier) :] == tier, helm
    # What the README says before the substitutions: make cluster's kubeconfig, the chart's image.
    original = readme.block("kubernetes").commands
    assert "export KUBECONFIG=/var/lib/dam-node/admin.kubeconfig" in original
    (helm,) = [c for c in original if c.startswith("helm install")]
    assert "--set image.repository=ghcr.io/mlsys/dam-operator" in helm


def test_a_substitution_of_a_command_the_block_does_not_have_fails_naming_it() -> None:
    block = readme.block("kubernetes")
    with pytest.raises(AssertionError, match=re.escape("'kubectl apply -f nowhere.yaml'")):
        block.substituted({"kubectl apply -f nowhere.yaml": None})
    with pytest.raises(AssertionError, match="does not come before"):
        block.between(node_readme.WATCH, node_readme.JOB)


def test_a_marked_block_is_read_command_by_command_with_continued_lines_kept(tmp_path: Path) -> None:
    text = "x\n<!-- readme-test: demo (a note) -->\n```bash\n# a comment\necho a \\\n  b   # two\n\nls\n```\n"
    (tmp_path / "README.md").write_text(text)
    assert readme.block("demo", tmp_path / "README.md").commands == ("echo a \\\n  b   # two", "ls")
    (tmp_path / "README.md").write_text(text.replace("```bash", "```"))
    with pytest.raises(AssertionError, match="not a ```bash fence"):
        readme.block("demo", tmp_path / "README.md")
    with pytest.raises(AssertionError, match="0 lines"):
        readme.block("other", tmp_path / "README.md")


def test_every_wait_of_the_block_has_a_timeout() -> None:
    for command in readme.block("kubernetes").commands:
        words = _words(command)
        if words[:2] == ["kubectl", "wait"] or "rollout" in words:
            assert any(w.startswith("--timeout=") for w in words), command


def test_the_example_job_is_what_the_blocks_commands_and_the_profile_expect() -> None:
    job = _job()
    pod = job["spec"]["template"]
    profile = yaml.safe_load((ROOT / "examples" / "damprofile.yaml").read_text())
    # Its pods are the profile's.
    assert pod["metadata"]["labels"].items() >= profile["spec"]["selector"]["matchLabels"].items()
    assert job["metadata"]["name"] == node_readme.EXAMPLE_JOB
    # The ConfigMap the block creates, mounted where the command reads the script.
    commands = [_words(c) for c in readme.block("kubernetes").commands]
    (create,) = [w for w in commands if w[:3] == ["kubectl", "create", "configmap"]]
    assert create[3:] == ["train", "--from-file=examples/train.py"]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    (container,) = pod["spec"]["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert volumes["train"]["configMap"]["name"] == "train"
    assert container["command"][:2] == ["python3", f"{mounts['train']}/train.py"]
    # The block's sed fills in the placeholder the Job's hostPath has, and applies this file.
    (sed,) = [w for w in commands if w[:1] == ["sed"]]
    placeholder = sed[1].split("|")[1]
    assert volumes["torch"]["hostPath"]["path"] == placeholder
    assert sed[2] == "examples/trainer-job.yaml" and sed[3:] == ["|", "kubectl", "apply", "-f", "-"]
    # A literal PYTHONPATH naming the torch mount (the webhook prepends the probe to a literal value).
    env = {e["name"]: e for e in container["env"]}
    assert env["PYTHONPATH"]["value"] == mounts["torch"]
    assert mounts["shm"] == "/dev/shm" and volumes["shm"]["emptyDir"]["medium"] == "Memory"
    assert "memory" in container["resources"]["requests"], container["resources"]


def test_the_example_job_meets_the_restricted_standard_but_for_the_torch_host_path() -> None:
    pod = _job()["spec"]["template"]
    assert pss.violations(pod) == ["pod: volume torch is a hostPath volume"]
    # Without the torch volume (an image that has torch), it passes.
    spec = pod["spec"]
    spec["volumes"] = [v for v in spec["volumes"] if v["name"] != "torch"]
    spec["containers"][0]["volumeMounts"] = [
        m for m in spec["containers"][0]["volumeMounts"] if m["name"] != "torch"
    ]
    assert pss.violations(pod) == []
