"""The pod watcher keeps the registry's pods equal to the API's: paged list, watch, relist.

The API here is a scripted fake of the two calls (``request`` for list pages, ``watch`` for
one watch stream); the same watcher against the real kube-apiserver, through the fault
proxy, is in tests/integration/test_operator_faults.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest

from dam_operator.cluster.adapters.kube import ApiError, GoneError
from dam_operator.cluster.adapters.podwatch import PodWatcher
from dam_operator.cluster.steps.registry import Registry

Script = list[Any]  # list pages / watch streams (lists of events) / exceptions, in call order


def pod(
    name: str, rv: str, *, ns: str = "ns", ip: str | None = "10.0.0.1", phase: str = "Running"
) -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": ns,
            "name": name,
            "uid": f"uid-{name}",
            "resourceVersion": rv,
            "labels": {"app": "t"},
        },
        "status": {"phase": phase, "podIP": ip},
    }


def page(items: list[dict[str, Any]], rv: str, token: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"resourceVersion": rv}
    if token:
        meta["continue"] = token
    return {"kind": "PodList", "metadata": meta, "items": items}


class FakeAPI:
    def __init__(self, lists: Script, watches: Script) -> None:
        self.lists = lists
        self.watches = watches
        self.list_params: list[dict[str, str]] = []
        self.watch_params: list[dict[str, str]] = []
        self.done = asyncio.Event()

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str = "application/json",
        params: Mapping[str, str] | None = None,
    ) -> Any:
        assert (method, path) == ("GET", "/api/v1/pods")
        self.list_params.append(dict(params or {}))
        answer = self.lists.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def watch(
        self, path: str, params: Mapping[str, str], *, read_timeout_seconds: float
    ) -> AsyncIterator[Mapping[str, Any]]:
        self.watch_params.append(dict(params))
        if not self.watches:
            self.done.set()
            await asyncio.Event().wait()  # the test ends here: a watch that never ends
        answer = self.watches.pop(0)
        if isinstance(answer, Exception):
            raise answer
        for event in answer:
            if isinstance(event, Exception):
                raise event
            yield event


async def run_until_script_ends(
    api: FakeAPI, registry: Registry, **kw: Any
) -> tuple[PodWatcher, list[float]]:
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    ticks = iter(range(0, 10_000, 10))  # every watch "lasts" 10 s unless a test says otherwise
    watcher = PodWatcher(
        api,
        registry,
        namespace=None,
        page_size=2,
        sleep=sleep,
        clock=kw.pop("clock", lambda: next(ticks)),
        **kw,
    )
    task = asyncio.create_task(watcher.run())
    done = asyncio.create_task(api.done.wait())
    await asyncio.wait({task, done}, timeout=5, return_when=asyncio.FIRST_COMPLETED)
    done.cancel()
    if task.done():
        task.result()  # what ended the watcher
    assert api.done.is_set(), "the watcher did not get to the end of the script"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    return watcher, sleeps


def names(registry: Registry) -> list[str]:
    return sorted(name for _, name in registry.pod_keys())


def test_a_paged_list_fills_the_index_and_the_watch_starts_at_its_version() -> None:
    async def scenario() -> None:
        reg = Registry()
        api = FakeAPI(
            lists=[page([pod("a", "5"), pod("b", "6")], "9", token="t1"), page([pod("c", "7")], "9")],
            watches=[],
        )
        watcher, _ = await run_until_script_ends(api, reg)
        assert watcher.synced.is_set()
        assert names(reg) == ["a", "b", "c"]
        assert api.list_params == [{"limit": "2"}, {"limit": "2", "continue": "t1"}]
        assert api.watch_params[0]["resourceVersion"] == "9"
        assert api.watch_params[0]["allowWatchBookmarks"] == "true"
        info = reg.pod("ns", "a")
        assert info is not None and info.pod_ip == "10.0.0.1" and info.scrapable

    asyncio.run(scenario())


def test_watch_events_add_change_and_remove_pods_and_move_the_version() -> None:
    async def scenario() -> None:
        reg = Registry()
        api = FakeAPI(
            lists=[page([pod("a", "5")], "5")],
            watches=[
                [
                    {"type": "ADDED", "object": pod("b", "6", ip=None, phase="Pending")},
                    {"type": "MODIFIED", "object": pod("b", "7")},
                    {"type": "DELETED", "object": pod("a", "8")},
                    {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "12"}}},
                ]
            ],
        )
        await run_until_script_ends(api, reg)
        assert names(reg) == ["b"]
        b = reg.pod("ns", "b")
        assert b is not None and b.scrapable
        assert [p["resourceVersion"] for p in api.watch_params] == ["5", "12"]

    asyncio.run(scenario())


def test_a_gone_version_relists_and_drops_pods_deleted_while_unwatched() -> None:
    async def scenario() -> None:
        reg = Registry()
        api = FakeAPI(
            lists=[page([pod("a", "5"), pod("b", "5")], "5"), page([pod("b", "30"), pod("c", "31")], "31")],
            watches=[[{"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old"}}]],
        )
        watcher, _ = await run_until_script_ends(api, reg)
        assert names(reg) == ["b", "c"]  # a was deleted while nobody watched
        assert watcher.lists == 2
        assert [p["resourceVersion"] for p in api.watch_params] == ["5", "31"]

    asyncio.run(scenario())


def test_a_410_answer_to_the_watch_or_an_expired_continue_token_lists_again() -> None:
    async def scenario() -> None:
        reg = Registry()
        api = FakeAPI(
            lists=[
                page([pod("a", "5")], "5"),
                page([pod("a", "40")], "41", token="old"),
                GoneError(410, "continue token expired"),
                page([pod("a", "40")], "42", token="new"),
                page([pod("d", "40")], "42"),
            ],
            watches=[GoneError(410, "too old")],
        )
        await run_until_script_ends(api, reg)
        assert names(reg) == ["a", "d"]
        assert api.list_params[-1] == {"limit": "2", "continue": "new"}
        assert [p["resourceVersion"] for p in api.watch_params] == ["5", "42"]

    asyncio.run(scenario())


def test_a_failed_or_dropped_watch_resumes_from_the_last_version_with_growing_backoff() -> None:
    async def scenario() -> None:
        reg = Registry()
        api = FakeAPI(
            lists=[page([pod("a", "5")], "5")],
            watches=[
                ApiError(503, "unavailable"),
                [{"type": "ADDED", "object": pod("b", "7")}, ApiError(0, "connection reset")],
                ApiError(0, "refused"),
                [{"type": "ERROR", "object": {"kind": "Status", "code": 500, "message": "internal"}}],
            ],
        )
        watcher, sleeps = await run_until_script_ends(api, reg, backoff_seconds=1.0, max_backoff_seconds=3.0)
        assert names(reg) == ["a", "b"]
        assert watcher.lists == 1  # no relist: the versions were still there
        assert [p["resourceVersion"] for p in api.watch_params] == ["5", "5", "7", "7", "7"]
        assert len(sleeps) == 4
        assert 0.5 <= sleeps[0] <= 1.0 and 1.0 <= sleeps[1] <= 2.0 and 1.5 <= sleeps[3] <= 3.0  # capped

    asyncio.run(scenario())


def test_a_watch_the_server_ends_at_once_backs_off_and_a_long_one_does_not() -> None:
    async def scenario() -> None:
        reg = Registry()
        api = FakeAPI(lists=[page([], "5")], watches=[[], [], []])
        times = iter([0.0, 0.1, 0.1, 0.2, 0.2, 400.0, 400.0, 400.0])
        _, sleeps = await run_until_script_ends(api, reg, clock=lambda: next(times))
        assert len(sleeps) == 2

    asyncio.run(scenario())


def test_pods_listed_in_one_namespace_use_its_path() -> None:
    from dam_operator.cluster.adapters.podwatch import pods_path

    assert pods_path("team-a") == "/api/v1/namespaces/team-a/pods"
    assert pods_path(None) == "/api/v1/pods"
