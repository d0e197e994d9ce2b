"""``make cluster`` / ``make cluster-down``: ``python -m dam_cluster up|down|status|footprint``.

- ``up`` starts the node in ``CLUSTER_DIR`` (``/var/lib/dam-node``; ``DAM_CLUSTER_DIR``), its processes
  outliving this one, prints progress to stderr and the admin kubeconfig's path as the last line of
  stdout. When a node already runs (``/run/dam-node/state.json``, its processes alive) it touches
  nothing: one line says so, the kubeconfig's path is printed as after a start, exit 0.
- ``down`` removes everything the node made (:func:`dam_cluster.node.down`).
- ``status`` says what runs and prints the kubeconfig's path; exit 0 when all of the node runs, 1 when
  a part of it exited, 3 when none of it runs.
- ``footprint`` prints the listing of :mod:`dam_cluster.footprint` (``--broad``: with the top-level
  directories too), for a diff of the machine before ``up`` and after ``down``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from dam_cluster.node import (
    CLUSTER_DIR,
    HOW_TO_GET,
    STATE_FILE,
    NodeCluster,
    NodeUnavailableError,
    _alive,
    _mounts_under,
    down,
    find_images,
    find_node_binaries,
    remove_stale_node,
)


def _say(line: str) -> None:
    print(f"cluster: {line}", file=sys.stderr, flush=True)


def _state() -> dict[str, Any] | None:
    try:
        state = json.loads(STATE_FILE.read_text() or "{}")
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        _say(f"cannot read {STATE_FILE} ({exc}): treating it as no node")
        return None
    return state if isinstance(state, dict) else None


def _alive_names(state: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(the names of the state's processes that run, those that do not)."""
    alive: list[str] = []
    dead: list[str] = []
    for p in state.get("processes", []):
        (alive if _alive(p["pid"], p["needle"]) else dead).append(p["name"])
    return alive, dead


def up(images_given: list[str] | None) -> int:
    state = _state()
    if state is not None:
        alive, dead = _alive_names(state)
        if alive:
            workdir = Path(state.get("workdir", ""))
            kubeconfig = workdir / "admin.kubeconfig"
            if workdir != CLUSTER_DIR:
                _say(
                    f"a node of another run already runs here (its directory {workdir}: a test session's?); "
                    "one node a machine: wait for it, or stop it with `make cluster-down`"
                )
                return 1
            if dead:
                _say(
                    f"already running, but {', '.join(dead)} exited (logs in {workdir}): "
                    "`make cluster-down` then `make cluster` starts it afresh"
                )
                return 1
            since = time.strftime("%H:%M:%S", time.localtime(state.get("started_at", 0)))
            _say(f"already running (since {since}; nothing changed): export KUBECONFIG={kubeconfig}")
            print(kubeconfig)
            return 0
        _say(f"removing what a stopped node left ({state.get('workdir')})")
        for problem in remove_stale_node():
            _say(f"NOT REMOVED: {problem}")
    try:
        binaries = find_node_binaries()
        images = (
            dict(zip(("base", "pause", "operator"), map(Path, images_given), strict=True))
            if images_given
            else find_images()
        )
    except NodeUnavailableError as exc:
        _say(f"cannot start a node: {exc}; {HOW_TO_GET}")
        return 1
    if CLUSTER_DIR.exists():  # an earlier node's logs and data; never one that runs (checked above)
        mounted = _mounts_under([str(CLUSTER_DIR)])
        if mounted:
            _say(f"{CLUSTER_DIR} still has mounts ({', '.join(mounted[:3])}): run `make cluster-down` first")
            return 1
        shutil.rmtree(CLUSTER_DIR)
    node = NodeCluster(binaries, CLUSTER_DIR, images, detached=True, progress=_say)
    started = time.monotonic()
    try:
        node.start()
    except KeyboardInterrupt:
        _say("interrupted: what was started is removed again")
        return 130
    except (NodeUnavailableError, AssertionError, RuntimeError, OSError) as exc:
        _say(f"the start failed, and what was started is removed again: {exc}")
        return 1
    _say(
        f"up in {time.monotonic() - started:.1f} s "
        f"(Node Ready {node.node_ready_s:.1f} s after kubelet start); "
        f"logs in {CLUSTER_DIR}; images: {', '.join(p.name for p in images.values())}"
    )
    _say(f"export KUBECONFIG={node.kubeconfig}")
    print(node.kubeconfig)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dam_cluster", description="a one-node Kubernetes cluster on this machine"
    )
    parser.add_argument("command", choices=["up", "down", "status", "footprint"])
    parser.add_argument(
        "--images",
        nargs=3,
        metavar=("BASE", "PAUSE", "OPERATOR"),
        help="the archives `tools/image/build.sh all` printed (default: those cached for the tree as it is)",
    )
    parser.add_argument("--broad", action="store_true", help="footprint: the top-level directories too")
    args = parser.parse_args()
    if args.command == "up":
        return up(args.images)
    if args.command == "footprint":
        from dam_cluster import footprint

        sys.stdout.write(footprint.render(footprint.snapshot(broad=args.broad)))
        return 0
    state = _state()
    if args.command == "down":
        if state is None:
            _say("no node runs here (nothing to remove)")
            return 0
        problems = down(state)
        for problem in problems:
            _say(f"NOT REMOVED: {problem}")
        _say("removed" if not problems else "removed, with the problems above")
        return 1 if problems else 0
    alive, dead = _alive_names(state) if state is not None else ([], [])
    if state is None or not alive:
        _say("down")
        return 3
    _say(f"running: {', '.join(alive)}" + (f"; exited: {', '.join(dead)}" if dead else ""))
    print(Path(state["workdir"]) / "admin.kubeconfig")
    return 1 if dead else 0


if __name__ == "__main__":
    sys.exit(main())
