"""The operator's in-memory view: DAMProfiles (parsed) and pods (a compact index).

kopf's profile event handler and the pod watcher (``podwatch``) feed it; the scheduler
and the webhook read it. Single event loop, no locks needed.
Pods are indexed by (namespace, label key, label value) so that matching a
profile's selector never scans every pod of a namespace.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal, TypeVar

from dam_operator.cluster.steps.injection import ANNOTATION_ACTION, SIDECAR_CONTAINER, pod_notes
from dam_operator.cluster.steps.spec import DAMProfileSpec, selector_matches
from dam_probe.lastwords import LastWords
from dam_probe.lastwords import parse as parse_last_words

ProfileKey = tuple[str, str]
_K = TypeVar("_K")
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
MAX_DEPARTED = 2048
"""Deleted Pods whose exit totals the registry keeps for the windows after (``Registry.depart_pod``)."""


@dataclass(frozen=True, slots=True)
class OomRecord:
    """The kubelet's record of a container the OOM killer ended (``reason: OOMKilled``)."""

    finished_at: str
    """RFC 3339 ``finishedAt`` (UTC strings compare in time order)."""
    container: str
    exit_code: int | None
    """137 (128 + SIGKILL) when the OOM killer took the container's main process; another code
    (e.g. 1) when it took a child, such as a DataLoader worker, and the main process then exited."""
    state: str
    """``state`` (the container is down now) or ``lastState`` (it restarted since)."""
    last_words: tuple[LastWords, ...] = ()
    """What its training processes' probes said on their way out (``dam_probe.lastwords``, from
    the termination ``message``): the loader's workers and their kills, for a process that died
    before any scrape; empty when none did (the main process SIGKILLed writes nothing)."""


def oom_record(pod_status: Mapping[str, Any]) -> OomRecord | None:
    """The latest ``OOMKilled`` termination in the pod's container statuses.

    The kubelet records it in ``state.terminated`` while the container is down and in
    ``lastState.terminated`` once it restarted (init containers included: a native sidecar or
    a loader in an init container can be killed too). containerd reports ``OOMKilled`` when the
    container's memory cgroup had an OOM kill, whichever of its processes was taken. On cgroup
    v1 the kill counter is not hierarchical and the killed container's cgroup vanishes at once:
    this record is the dependable one (issue 18's node runs).
    """
    latest: OomRecord | None = None
    for key in ("containerStatuses", "initContainerStatuses"):
        for cs in pod_status.get(key) or ():
            if not isinstance(cs, Mapping):
                continue
            for state_key in ("state", "lastState"):
                terminated = (cs.get(state_key) or {}).get("terminated") or {}
                if isinstance(terminated, Mapping) and terminated.get("reason") == "OOMKilled":
                    when = str(terminated.get("finishedAt") or "")
                    code = terminated.get("exitCode")
                    if when and (latest is None or when > latest.finished_at):
                        message = terminated.get("message")
                        latest = OomRecord(
                            when,
                            str(cs.get("name") or ""),
                            code if isinstance(code, int) and not isinstance(code, bool) else None,
                            state_key,
                            parse_last_words(message) if isinstance(message, str) else (),
                        )
    return latest


@dataclass(frozen=True, slots=True)
class RestartRecord:
    """The kubelet's record of the training containers' restarts (every container but the sidecar)."""

    count: int
    """``restartCount`` summed over the pod's containers (the kubelet raises it at each restart)."""
    finished_at: str | None
    """RFC 3339 ``lastState.terminated.finishedAt`` of the latest restart: when the old process ended."""
    started_at: str | None
    """RFC 3339 ``state.running.startedAt`` of that container: when the new one started."""
    terminated_at: str | None
    """RFC 3339 ``state.terminated.finishedAt``: when a container that is down now ended (a Failed pod)."""
    running_since: str | None = None
    """RFC 3339 ``state.running.startedAt``, the earliest of the running training containers: the
    time from it to the training process's start (an entrypoint script, ``pip install``, torchrun's
    own start) is the job's too."""


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def restart_record(pod_status: Mapping[str, Any], skip: str = SIDECAR_CONTAINER) -> RestartRecord:
    """The training containers' restarts, from ``containerStatuses`` (the ``skip`` container aside).

    The kubelet keeps the previous termination in ``lastState.terminated`` and the current start
    in ``state.running.startedAt`` (core/v1 ContainerStatus); the container whose last
    termination is the latest tells the restart's downtime. A native sidecar lives in
    ``initContainerStatuses`` and is not read; a plain sidecar container is skipped by name.
    """
    count = 0
    finished: str | None = None
    started: str | None = None
    terminated: str | None = None
    running: str | None = None
    for cs in pod_status.get("containerStatuses") or ():
        if not isinstance(cs, Mapping) or cs.get("name") == skip:
            continue
        n = cs.get("restartCount")
        count += n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 0
        state = _mapping(cs.get("state"))
        end = str(_mapping(_mapping(cs.get("lastState")).get("terminated")).get("finishedAt") or "")
        if end and (finished is None or end > finished):
            finished = end
            started = str(_mapping(state.get("running")).get("startedAt") or "") or None
        down = str(_mapping(state.get("terminated")).get("finishedAt") or "")
        if down and (terminated is None or down > terminated):
            terminated = down
        up = str(_mapping(state.get("running")).get("startedAt") or "")
        if up and (running is None or up < running):
            running = up
    return RestartRecord(count, finished, started, terminated, running)


def sidecar_restart(pod_status: Mapping[str, Any], name: str = SIDECAR_CONTAINER) -> str | None:
    """RFC 3339 ``finishedAt`` of the sidecar's last termination: when the kubelet restarted it
    (a native sidecar in ``initContainerStatuses``, a plain one in ``containerStatuses``). None
    when it never ended. A restart between two scrapes answers both, so only this record shows
    the gap (issue 18's node runs: a killed native sidecar is back within a second or two)."""
    for key in ("initContainerStatuses", "containerStatuses"):
        for cs in pod_status.get(key) or ():
            if isinstance(cs, Mapping) and cs.get("name") == name:
                end = _mapping(_mapping(cs.get("lastState")).get("terminated")).get("finishedAt")
                return str(end) if end else None
    return None


def exit_words(pod_status: Mapping[str, Any], sidecar: str = SIDECAR_CONTAINER) -> tuple[LastWords, ...]:
    """The processes' exit totals (``dam_probe.lastwords``, lines with ``Totals``), from the
    ``state.terminated.message`` of the containers that are down now: the ``sidecar``'s lines when
    it wrote any (``dam_sidecar.farewell``: one a rank, the figures its scrapes read, taken at the
    rank's last publish, whatever way the processes ended), else the training containers' (each
    probe's own at a clean exit). Empty while they run, and when none was written."""
    own: list[LastWords] = []
    probes: list[LastWords] = []
    for key in ("initContainerStatuses", "containerStatuses"):
        for cs in pod_status.get(key) or ():
            if not isinstance(cs, Mapping):
                continue
            is_sidecar = cs.get("name") == sidecar
            if key == "initContainerStatuses" and not is_sidecar:
                continue
            message = _mapping(_mapping(cs.get("state")).get("terminated")).get("message")
            if isinstance(message, str) and message:
                said = [w for w in parse_last_words(message) if w.totals is not None]
                (own if is_sidecar else probes).extend(said)
    return tuple(own or probes)


def last_oom_kill(pod_status: Mapping[str, Any]) -> str | None:
    """The latest ``finishedAt`` of an ``OOMKilled`` termination (``oom_record``)."""
    record = oom_record(pod_status)
    return None if record is None else record.finished_at


@dataclass(frozen=True, slots=True)
class PodInfo:
    """What the operator needs of a pod; built from the pod body by the pod watcher."""

    namespace: str
    name: str
    labels: Mapping[str, str]
    uid: str = ""
    pod_ip: str | None = None
    phase: str | None = None
    instrumented: bool = False
    deleting: bool = False
    last_oom_kill: str | None = None
    """When a container of the pod was last OOM-killed (RFC 3339 ``finishedAt`` of a terminated
    state with reason ``OOMKilled``, current or last); None when never seen."""
    oom: OomRecord | None = None
    """That kill's whole record (``oom_record``): which container, its exit code, where."""
    action: str | None = None
    """The ``dam.mlsys.dev/action`` annotation the webhook set (``"ID:applied"``/``"ID:withheld"``)."""
    notes: tuple[str, ...] = ()
    """How the webhook (did not) instrument it (``injection.pod_notes``); empty for most pods."""
    restart: RestartRecord | None = None
    """Its training containers' restarts (``restart_record``); None when not read (tests)."""
    sidecar_restarted_at: str | None = None
    """When its sidecar last ended and was restarted (``sidecar_restart``); None when never."""
    started_at: str | None = None
    """``status.startTime`` (RFC 3339): when the kubelet took the pod; None until then."""
    exit_words: tuple[LastWords, ...] = ()
    """Its training processes' last words with their exit totals (``exit_words``), once their
    containers ended: the goodput ledger counts what they did after the pod's last scrape."""
    owner: str | None = None
    """The uid of its controller (``metadata.ownerReferences`` with ``controller: true``: its Job,
    StatefulSet, ...); None for a bare pod. A pod replaces a failed or deleted one only under the
    same owner (a later Job of the same profile starts a new run, it restarts nothing)."""

    @property
    def key(self) -> ProfileKey:
        return (self.namespace, self.name)

    @property
    def active(self) -> bool:
        """Counts as a training pod of a profile: not finished, not being deleted."""
        return not self.deleting and self.phase not in TERMINAL_PHASES

    @property
    def scrapable(self) -> bool:
        """Running with an IP. Pods without the injected sidecar are scraped too, so that a
        sidecar added by hand (or by another injector) is honoured."""
        return self.active and bool(self.pod_ip) and self.phase == "Running"

    @classmethod
    def from_body(cls, body: Mapping[str, Any], instrumented: bool) -> PodInfo:
        meta = body.get("metadata") or {}
        status = body.get("status") or {}
        labels = meta.get("labels") or {}
        oom = oom_record(status)
        return cls(
            namespace=str(meta.get("namespace") or ""),
            name=str(meta.get("name") or ""),
            uid=str(meta.get("uid") or ""),
            labels=MappingProxyType({str(k): str(v) for k, v in labels.items()}),
            pod_ip=status.get("podIP") or None,
            phase=status.get("phase") or None,
            instrumented=instrumented,
            deleting=bool(meta.get("deletionTimestamp")),
            last_oom_kill=None if oom is None else oom.finished_at,
            oom=oom,
            action=str((meta.get("annotations") or {}).get(ANNOTATION_ACTION) or "") or None,
            notes=pod_notes(body),
            restart=restart_record(status),
            sidecar_restarted_at=sidecar_restart(status),
            started_at=status.get("startTime") or None,
            exit_words=exit_words(status),
            owner=controller_uid(meta),
        )


def _rarest(
    index: Mapping[tuple[str, str, str], Collection[_K]],
    namespace: str,
    match_labels: Mapping[str, str],
    every: Collection[_K],
) -> Collection[_K]:
    """A selector's candidates from a label index ((namespace, key, value) -> entries): those of
    its rarest ``matchLabels`` pair, none when a pair has none, ``every`` without ``matchLabels``
    (its expressions are checked on each candidate by the caller)."""
    smallest: Collection[_K] | None = None
    for k, v in match_labels.items():
        found = index.get((namespace, k, v))
        if not found:
            return ()
        if smallest is None or len(found) < len(smallest):
            smallest = found
    return every if smallest is None else smallest


def controller_uid(meta: Mapping[str, Any]) -> str | None:
    """The uid of the pod's managing controller (the owner reference with ``controller: true``;
    the API server allows at most one), None when it has none."""
    for ref in meta.get("ownerReferences") or ():
        if isinstance(ref, Mapping) and ref.get("controller") is True and ref.get("uid"):
            return str(ref["uid"])
    return None


def encode_status(status: Mapping[str, Any]) -> bytes:
    """A status as compact JSON, deflated: what the registry keeps between windows.

    zlib level 1 (RFC 1950): a profile's 1.8 KB of JSON keeps in about 0.8 KB, for about 7 µs a
    round trip (docs/performance.md); a status is decoded once or twice a window."""
    return zlib.compress(json.dumps(status, separators=(",", ":"), ensure_ascii=False).encode(), 1)


def decode_status(packed: bytes) -> dict[str, Any]:
    """What ``encode_status`` kept, decoded (a new dict each time: changing it changes nothing)."""
    value = json.loads(zlib.decompress(packed))
    return value if isinstance(value, dict) else {}


_EMPTY_STATUS = encode_status({})


@dataclass(slots=True)
class ProfileEntry:
    """One DAMProfile as the operator knows it. ``spec`` is None when the spec is invalid."""

    namespace: str
    name: str
    uid: str
    generation: int | None
    spec: DAMProfileSpec | None
    error: str | None = None
    status_packed: bytes = _EMPTY_STATUS
    """The last status known (read from the object on resume, then what we wrote), as
    ``encode_status`` keeps it: a profile's status is read once or twice a window and kept for
    the rest of it; as decoded objects it took 2.6 times the memory of its compact JSON (8 KB a
    profile), and deflated it takes under half of that JSON (docs/performance.md)."""
    revision: int = 0
    """Bumped on each (re)registration; lets the scheduler drop stale work."""

    @property
    def status(self) -> dict[str, Any]:
        """The last status known, decoded (a new dict each time: changing it changes nothing)."""
        return decode_status(self.status_packed)

    @status.setter
    def status(self, value: Mapping[str, Any]) -> None:
        self.status_packed = encode_status(value)

    @property
    def key(self) -> ProfileKey:
        return (self.namespace, self.name)

    @property
    def valid(self) -> bool:
        return self.spec is not None


ChangeKind = Literal["upsert", "remove"]
Listener = Callable[[ChangeKind, ProfileEntry], None]


class Registry:
    def __init__(self) -> None:
        self._profiles: dict[ProfileKey, ProfileEntry] = {}
        self._profiles_by_ns: dict[str, dict[str, ProfileEntry]] = {}
        self._pods: dict[str, dict[str, PodInfo]] = {}
        self._label_index: dict[tuple[str, str, str], set[str]] = {}
        self._listeners: list[Listener] = []
        self._revision = 0
        # Pods the API deleted whose training processes left exit totals (oldest first, at most
        # MAX_DEPARTED), and the same by namespace: a window after their deletion still counts
        # what they did after their last scrape (``exited_pods_for``).
        self._departed: dict[tuple[str, str, str], PodInfo] = {}
        self._departed_by_ns: dict[str, dict[tuple[str, str, str], PodInfo]] = {}
        self._departed_index: dict[tuple[str, str, str], set[tuple[str, str, str]]] = {}

    # ------------------------------------------------------------ profiles

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def upsert_profile(
        self,
        namespace: str,
        name: str,
        *,
        uid: str,
        generation: int | None,
        spec: DAMProfileSpec | None,
        error: str | None = None,
        status: Mapping[str, Any] | None = None,
    ) -> ProfileEntry:
        """Register or replace a profile (bumps its revision).

        ``status`` is the object's status as kopf saw it; it seeds the known status of a
        profile seen for the first time (resume after a restart). For a profile already
        known (same uid) the status the operator wrote last is kept: the operator is the
        only writer of the status, and a watch event may carry an older one.
        """
        old = self._profiles.get((namespace, name))
        if old is not None and old.uid != uid:
            old = None
        self._revision += 1
        entry = ProfileEntry(
            namespace=namespace,
            name=name,
            uid=uid,
            generation=generation,
            spec=spec,
            error=error,
            status_packed=old.status_packed if old is not None else encode_status(status or {}),
            revision=self._revision,
        )
        self._profiles[entry.key] = entry
        self._profiles_by_ns.setdefault(namespace, {})[name] = entry
        for listener in self._listeners:
            listener("upsert", entry)
        return entry

    def remove_profile(self, namespace: str, name: str) -> ProfileEntry | None:
        entry = self._profiles.pop((namespace, name), None)
        if entry is None:
            return None
        in_ns = self._profiles_by_ns.get(namespace, {})
        in_ns.pop(name, None)
        if not in_ns:
            self._profiles_by_ns.pop(namespace, None)
        for listener in self._listeners:
            listener("remove", entry)
        return entry

    def knows(self, namespace: str, name: str, *, uid: str, generation: int | None) -> bool:
        """Whether this object (uid) at this spec generation is the registered profile."""
        entry = self._profiles.get((namespace, name))
        return entry is not None and entry.uid == uid and entry.generation == generation

    def profile(self, namespace: str, name: str) -> ProfileEntry | None:
        return self._profiles.get((namespace, name))

    def profiles(self) -> list[ProfileEntry]:
        return list(self._profiles.values())

    def __len__(self) -> int:
        return len(self._profiles)

    def profiles_in(self, namespace: str) -> list[ProfileEntry]:
        """Valid profiles of one namespace, by name."""
        return sorted(
            (e for e in self._profiles_by_ns.get(namespace, {}).values() if e.spec is not None),
            key=lambda e: e.name,
        )

    # ------------------------------------------------------------ pods

    def upsert_pod(self, pod: PodInfo) -> None:
        self.remove_pod(pod.namespace, pod.name)
        self._pods.setdefault(pod.namespace, {})[pod.name] = pod
        for k, v in pod.labels.items():
            self._label_index.setdefault((pod.namespace, k, v), set()).add(pod.name)

    def remove_pod(self, namespace: str, name: str) -> PodInfo | None:
        in_ns = self._pods.get(namespace)
        if not in_ns:
            return None
        pod = in_ns.pop(name, None)
        if pod is None:
            return None
        for k, v in pod.labels.items():
            key = (namespace, k, v)
            names = self._label_index.get(key)
            if names is not None:
                names.discard(name)
                if not names:
                    del self._label_index[key]
        if not in_ns:
            del self._pods[namespace]
        return pod

    def depart_pod(self, pod: PodInfo) -> None:
        """The API deleted ``pod`` (its last body): out of the index; kept among the departed when
        its processes left exit totals, until MAX_DEPARTED later ones push it out (a window or two
        at any churn a cluster sees: 2,048 Pods deleted between two windows)."""
        self.remove_pod(pod.namespace, pod.name)
        if not pod.exit_words:
            return
        key = (pod.namespace, pod.name, pod.uid)
        self._forget_departed(key)
        self._departed[key] = pod
        self._departed_by_ns.setdefault(pod.namespace, {})[key] = pod
        for k, v in pod.labels.items():
            self._departed_index.setdefault((pod.namespace, k, v), set()).add(key)
        while len(self._departed) > MAX_DEPARTED:
            self._forget_departed(next(iter(self._departed)))

    def _forget_departed(self, key: tuple[str, str, str]) -> None:
        pod = self._departed.pop(key, None)
        if pod is None:
            return
        in_ns = self._departed_by_ns[pod.namespace]
        del in_ns[key]
        if not in_ns:
            del self._departed_by_ns[pod.namespace]
        for k, v in pod.labels.items():
            keys = self._departed_index[(pod.namespace, k, v)]
            keys.discard(key)
            if not keys:
                del self._departed_index[(pod.namespace, k, v)]

    def pod(self, namespace: str, name: str) -> PodInfo | None:
        return self._pods.get(namespace, {}).get(name)

    def pod_keys(self) -> list[ProfileKey]:
        """(namespace, name) of every pod in the index."""
        return [(ns, name) for ns, pods in self._pods.items() for name in pods]

    def pod_count(self) -> int:
        return sum(len(p) for p in self._pods.values())

    def _matching(self, entry: ProfileEntry, keep: Callable[[PodInfo], bool]) -> list[PodInfo]:
        """Pods of the profile's namespace that its selector matches and ``keep`` keeps, by name.

        The candidates come from the label index (the selector's rarest ``matchLabels`` pair), so
        an evaluation costs the profile's own pods, not every pod of the namespace: at 5,000
        profiles in one namespace a scan per evaluation was a fifth of the operator's CPU.
        """
        if entry.spec is None:
            return []
        selector = entry.spec.selector
        in_ns = self._pods.get(entry.namespace, {})
        candidates = list(_rarest(self._label_index, entry.namespace, selector.match_labels, in_ns.keys()))
        out = [
            pod
            for name in candidates
            if (pod := in_ns.get(name)) is not None and keep(pod) and selector_matches(selector, pod.labels)
        ]
        return sorted(out, key=lambda p: p.name)

    def pods_for(self, entry: ProfileEntry) -> list[PodInfo]:
        """Active pods of the profile's namespace that its selector matches, by name."""
        return self._matching(entry, lambda p: p.active)

    def finished_pods_for(self, entry: ProfileEntry) -> list[PodInfo]:
        """Finished pods (Failed, Succeeded) of the profile, by name: a Failed pod's replacement
        takes over its rank, and the time between is the job's restart badput."""
        return self._matching(entry, lambda p: p.phase in TERMINAL_PHASES)

    def exited_pods_for(self, entry: ProfileEntry) -> list[PodInfo]:
        """Pods of the profile no longer active whose processes left exit totals
        (``PodInfo.exit_words``), terminated or being deleted, and those the API deleted since
        (``depart_pod``); and the pods being deleted whose words have not come yet; by name. The
        goodput ledger counts their last seconds (and waits for them)."""
        out = self._matching(
            entry,
            lambda p: (
                not p.active and (bool(p.exit_words) or (p.deleting and p.phase not in TERMINAL_PHASES))
            ),
        )
        return sorted([*out, *self._departed_for(entry)], key=lambda p: p.name)

    def _departed_for(self, entry: ProfileEntry) -> list[PodInfo]:
        """The departed pods the profile's selector matches, from the rarest of its
        ``matchLabels`` pairs' index, as ``_matching`` does (not every departed pod a window)."""
        in_ns = self._departed_by_ns.get(entry.namespace)
        if not in_ns or entry.spec is None:
            return []
        selector = entry.spec.selector
        candidates = list(_rarest(self._departed_index, entry.namespace, selector.match_labels, in_ns.keys()))
        return [p for key in candidates if selector_matches(selector, (p := in_ns[key]).labels)]

    def oom_ended_pods_for(self, entry: ProfileEntry) -> list[PodInfo]:
        """Finished pods (Failed, Succeeded) of the profile whose container was OOM-killed, by name.

        With ``restartPolicy: Never`` an OOM-killed trainer's Pod is Failed seconds after it
        started, its sidecar gone with it: it never forms a window, yet it is the job's evidence.
        """
        return self._matching(entry, lambda p: p.last_oom_kill is not None and not p.active)
