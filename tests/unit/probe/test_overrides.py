"""DataLoader overrides: the versioned variable, the rules that protect the user's loader, the patch."""

from __future__ import annotations

import functools
import json
import multiprocessing
import os
import sys
import types
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from dam_probe import overrides
from dam_probe.overrides import (
    ENV_LOADER_OVERRIDES,
    MIN_SHM_BYTES,
    LoaderOverrides,
    OverrideError,
    WorkerEnvironment,
    loader_override_env,
    overrides_from_env,
    parse_overrides,
    patch_dataloader,
    plan_loader,
    spawn_problem,
    worker_environment,
)

ROOMY = WorkerEnvironment(
    cpus=8, shm_bytes=8 << 30, default_start_method="fork", daemon=False, accelerator=False
)


@pytest.fixture(autouse=True)
def fresh_log(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with nothing said yet (lines are printed once per process)."""
    monkeypatch.setattr(overrides, "_said", set())


# --- the variable ---------------------------------------------------------------------------


def test_a_full_version_1_value_parses_into_its_settings() -> None:
    got = parse_overrides(
        '{"version":1,"num_workers":4,"prefetch_factor":4,"persistent_workers":true,"pin_memory":true}'
    )
    assert got == LoaderOverrides(num_workers=4, prefetch_factor=4, persistent_workers=True, pin_memory=True)
    assert got.allow_lower is False


def test_loader_override_env_builds_the_variable_the_probe_reads_back() -> None:
    env = loader_override_env({"prefetch_factor": 4, "num_workers": 2, "allow_lower": True})
    assert list(env) == [ENV_LOADER_OVERRIDES] == ["DAM_LOADER_OVERRIDES"]
    assert json.loads(env[ENV_LOADER_OVERRIDES]) == {
        "version": 1,
        "num_workers": 2,
        "prefetch_factor": 4,
        "allow_lower": True,
    }
    parsed = overrides_from_env(env)
    assert parsed == LoaderOverrides(num_workers=2, prefetch_factor=4, allow_lower=True)
    assert loader_override_env(parsed.settings()) == env  # a round trip gives the same text


@pytest.mark.parametrize(
    ("settings", "fragment"),
    [
        ({"num_workers": -1}, "num_workers must be between 0 and 256"),
        ({"num_workers": True}, "num_workers must be an integer"),
        ({"prefetch_factor": 0}, "prefetch_factor must be between 1 and 64"),
        ({"pin_memory": 1}, "pin_memory must be true or false"),
        ({"workers": 4}, "unknown setting 'workers'"),
        ({"version": 1, "num_workers": 2}, "adds the version"),
    ],
)
def test_loader_override_env_rejects_what_the_probe_would_reject(
    settings: Mapping[str, Any], fragment: str
) -> None:
    with pytest.raises(OverrideError, match=fragment):
        loader_override_env(settings)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("num_workers=4", "not valid JSON"),
        ('{"version":1,"num_workers":4', "not valid JSON"),
        ("[1, 2]", "expected a JSON object, got list"),
        ('{"num_workers":4}', 'no "version"'),
        ('{"version":2,"num_workers":4}', "unsupported version 2"),
        ('{"version":"1","num_workers":4}', "unsupported version '1'"),
        ('{"version":true,"num_workers":4}', "unsupported version True"),
        ('{"version":1,"num_workers":-2}', "num_workers must be between 0 and 256"),
        ('{"version":1,"num_workers":4.0}', "num_workers must be an integer"),
        ('{"version":1,"num_workers":"4"}', "num_workers must be an integer"),
        ('{"version":1,"num_workers":100000}', "num_workers must be between 0 and 256"),
        ('{"version":1,"persistent_workers":"yes"}', "persistent_workers must be true or false"),
        ('{"version":1,"num_workers":2,"num_workers":8}', "'num_workers' given twice"),
        ('{"version":1,"batch_size":64}', "unknown setting 'batch_size'"),
    ],
)
def test_a_bad_value_is_rejected_whole_with_the_problem_named(text: str, fragment: str) -> None:
    with pytest.raises(OverrideError, match=fragment):
        overrides_from_env({ENV_LOADER_OVERRIDES: text})


@pytest.mark.parametrize("environ", [{}, {ENV_LOADER_OVERRIDES: ""}, {ENV_LOADER_OVERRIDES: "  "}])
def test_an_unset_or_blank_variable_means_no_overrides(environ: dict[str, str]) -> None:
    assert overrides_from_env(environ) is None


# --- the rules ------------------------------------------------------------------------------


class MapData:
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        return i


class StreamData:
    def __iter__(self) -> Iterator[int]:
        return iter(range(8))


class EpochData(MapData):
    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch


def loader_args(**given: object) -> dict[str, object]:
    """The arguments of torch 2.13's DataLoader with its defaults (as ``apply_defaults`` gives)."""
    args: dict[str, object] = {
        "dataset": MapData(),
        "batch_size": 1,
        "shuffle": None,
        "sampler": None,
        "batch_sampler": None,
        "num_workers": 0,
        "collate_fn": None,
        "pin_memory": False,
        "drop_last": False,
        "timeout": 0,
        "worker_init_fn": None,
        "multiprocessing_context": None,
        "generator": None,
        "prefetch_factor": None,
        "persistent_workers": False,
        "pin_memory_device": "",
        "in_order": True,
    }
    args.update(given)
    return args


def no_spawn_check(method: str, objects: Mapping[str, object]) -> str | None:
    raise AssertionError(f"the spawn check must not run here ({method})")


def test_workers_are_raised_and_the_change_is_described() -> None:
    plan = plan_loader(
        loader_args(), LoaderOverrides(num_workers=4, prefetch_factor=4), ROOMY, spawn_check=no_spawn_check
    )
    assert plan.refused is None
    assert plan.updates() == {"num_workers": 4, "prefetch_factor": 4}
    assert plan.message() == "num_workers 0 → 4, prefetch_factor None → 4"


def test_workers_are_capped_at_the_cpus_the_process_may_use() -> None:
    env = WorkerEnvironment(cpus=2, shm_bytes=8 << 30)
    plan = plan_loader(loader_args(), LoaderOverrides(num_workers=8), env)
    assert plan.updates() == {"num_workers": 2}
    assert "num_workers capped at 2 CPUs (override 8)" in plan.message()
    # A user who already runs more workers than CPUs keeps them.
    plan = plan_loader(loader_args(num_workers=3), LoaderOverrides(num_workers=8), env)
    assert plan.updates() == {}


def test_a_lower_override_never_lowers_the_users_values_unless_it_says_so() -> None:
    user = loader_args(num_workers=8, prefetch_factor=6, persistent_workers=True, pin_memory=True)
    lower = LoaderOverrides(num_workers=2, prefetch_factor=2, persistent_workers=False, pin_memory=False)
    plan = plan_loader(user, lower, ROOMY)
    assert plan.updates() == {}
    assert plan.message().startswith("overrides change nothing: num_workers stays 8 (override 2 is lower")
    plan = plan_loader(user, LoaderOverrides(**{**lower.__dict__, "allow_lower": True}), ROOMY)
    assert plan.updates() == {
        "num_workers": 2,
        "prefetch_factor": 2,
        "persistent_workers": False,
        "pin_memory": False,
    }


def test_a_rollback_to_zero_workers_clears_the_settings_torch_allows_only_with_workers() -> None:
    user = loader_args(num_workers=4, prefetch_factor=4, persistent_workers=True)
    plan = plan_loader(user, LoaderOverrides(num_workers=0, allow_lower=True), ROOMY)
    assert plan.updates() == {"num_workers": 0, "prefetch_factor": None, "persistent_workers": False}
    for given in ({"timeout": 5.0}, {"multiprocessing_context": "fork"}):
        plan = plan_loader(
            loader_args(num_workers=4, **given), LoaderOverrides(num_workers=0, allow_lower=True), ROOMY
        )
        assert plan.refused is not None
        assert "cannot lower num_workers to 0" in plan.refused
        assert plan.updates() == {}


def test_prefetch_and_persistent_workers_need_workers() -> None:
    plan = plan_loader(loader_args(), LoaderOverrides(prefetch_factor=4, persistent_workers=True), ROOMY)
    assert plan.updates() == {}
    assert plan.message() == (
        "overrides change nothing: prefetch_factor not applied: needs num_workers > 0; "
        "persistent_workers not applied: needs num_workers > 0"
    )


def test_prefetch_is_compared_with_torchs_default_of_two() -> None:
    two = plan_loader(loader_args(num_workers=2), LoaderOverrides(prefetch_factor=2), ROOMY)
    assert two.updates() == {}
    one = plan_loader(loader_args(num_workers=2), LoaderOverrides(prefetch_factor=1), ROOMY)
    assert one.updates() == {}
    assert "prefetch_factor stays 2" in one.message()


@pytest.mark.parametrize(
    ("dataset", "iterable_cls"),
    [
        (StreamData(), None),  # duck typing: __iter__ and no __getitem__
        (MapData(), MapData),  # torch's IterableDataset inherits a __getitem__: the class decides
    ],
)
def test_an_iterable_dataset_without_workers_is_left_alone(
    dataset: object, iterable_cls: type | None
) -> None:
    ovr = LoaderOverrides(num_workers=4, pin_memory=True)
    plan = plan_loader(loader_args(dataset=dataset), ovr, ROOMY, iterable_cls=iterable_cls)
    assert plan.refused is not None
    assert plan.refused.startswith("IterableDataset with num_workers=0")
    assert plan.updates() == {}
    assert plan.message().startswith("overrides not applied: IterableDataset")


def test_an_iterable_dataset_that_already_uses_workers_gets_more() -> None:
    plan = plan_loader(
        loader_args(dataset=StreamData(), num_workers=2), LoaderOverrides(num_workers=4), ROOMY
    )
    assert plan.updates() == {"num_workers": 4}


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        (WorkerEnvironment(cpus=1, shm_bytes=8 << 30), "only 1 CPU"),
        (WorkerEnvironment(cpus=4, shm_bytes=None), "no /dev/shm"),
        (WorkerEnvironment(cpus=4, shm_bytes=64 << 20), "/dev/shm is only 64 MiB"),
        (WorkerEnvironment(cpus=4, shm_bytes=8 << 30, daemon=True), "daemonic process"),
    ],
)
def test_workers_impossible_in_the_environment_leave_the_loader_alone(
    env: WorkerEnvironment, fragment: str
) -> None:
    plan = plan_loader(loader_args(), LoaderOverrides(num_workers=4), env)
    assert plan.refused is not None
    assert fragment in plan.refused
    assert plan.updates() == {}


def test_a_tiny_shm_also_stops_more_batches_in_flight_but_not_a_rollback() -> None:
    tiny = WorkerEnvironment(cpus=4, shm_bytes=MIN_SHM_BYTES - 1)
    more = plan_loader(loader_args(num_workers=2), LoaderOverrides(prefetch_factor=8), tiny)
    assert more.refused is not None
    less = plan_loader(loader_args(num_workers=2), LoaderOverrides(num_workers=1, allow_lower=True), tiny)
    assert less.updates() == {"num_workers": 1}
    # Without a /dev/shm requirement (not Linux) the size does not matter.
    other = WorkerEnvironment(cpus=4, shm_required=False, shm_bytes=None)
    assert plan_loader(loader_args(), LoaderOverrides(num_workers=2), other).updates() == {"num_workers": 2}


def test_in_order_false_without_workers_is_left_alone() -> None:
    plan = plan_loader(loader_args(in_order=False), LoaderOverrides(num_workers=2), ROOMY)
    assert plan.refused == "in_order=False: workers would deliver samples out of order"


def test_the_spawn_check_runs_only_when_workers_start_from_none_under_spawn() -> None:
    calls: list[tuple[str, list[str]]] = []

    def check(method: str, objects: Mapping[str, object]) -> str | None:
        calls.append((method, sorted(objects)))
        return "collate_fn is not picklable"

    def collate(batch: object) -> object:
        return batch

    ovr = LoaderOverrides(num_workers=2)
    spawn_env = WorkerEnvironment(cpus=4, shm_bytes=8 << 30, default_start_method="spawn")
    plan = plan_loader(loader_args(collate_fn=collate), ovr, spawn_env, spawn_check=check)
    assert plan.refused == "collate_fn is not picklable"
    assert calls == [("spawn", ["collate_fn", "dataset"])]
    # The loader's own context wins over the default start method, as a string or a context.
    ctx = multiprocessing.get_context("forkserver")
    for given in ("spawn", ctx):
        calls.clear()
        plan = plan_loader(
            loader_args(num_workers=1, multiprocessing_context=given), ovr, ROOMY, spawn_check=check
        )
        assert plan.updates() == {"num_workers": 2}  # the user's code already starts workers this way
        assert calls == []
    # Fork needs nothing pickled.
    assert plan_loader(loader_args(collate_fn=collate), ovr, ROOMY, spawn_check=no_spawn_check).updates() == {
        "num_workers": 2
    }


def test_persistent_workers_are_not_given_to_a_dataset_that_changes_per_epoch() -> None:
    ovr = LoaderOverrides(num_workers=2, persistent_workers=True)
    plan = plan_loader(loader_args(dataset=EpochData()), ovr, ROOMY)
    assert plan.updates() == {"num_workers": 2}
    assert "persistent_workers not applied: the dataset has set_epoch()" in plan.message()
    assert plan_loader(loader_args(), ovr, ROOMY).updates() == {"num_workers": 2, "persistent_workers": True}


class SequentialSampler:  # named as torch's: iterates in order
    def __iter__(self) -> Iterator[int]:
        return iter(range(8))


class SeededSampler:  # shaped like DistributedSampler: seed + epoch, not the global RNG
    seed = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch


class BatchSampler:
    def __init__(self, sampler: object) -> None:
        self.sampler = sampler
        self.batch_size = 2


@pytest.mark.parametrize(
    ("given", "applied"),
    [
        ({}, True),
        ({"shuffle": True}, False),
        ({"sampler": SequentialSampler()}, True),
        ({"sampler": SeededSampler()}, True),
        ({"sampler": [3, 1, 2]}, False),
        ({"batch_sampler": BatchSampler(SeededSampler())}, True),
        ({"batch_sampler": BatchSampler(object())}, False),
    ],
)
def test_persistent_workers_are_not_given_to_a_loader_whose_order_draws_from_the_rng(
    given: dict[str, object], applied: bool
) -> None:
    # torch draws the workers' base seed once per iterator: persistent workers leave one draw
    # out per epoch, so a shuffle from the global RNG would change from the second epoch on.
    plan = plan_loader(loader_args(num_workers=2, **given), LoaderOverrides(persistent_workers=True), ROOMY)
    assert ("persistent_workers" in plan.updates()) is applied
    assert ("would change the order of later epochs" in plan.message()) is not applied


def test_pin_memory_needs_an_accelerator() -> None:
    ovr = LoaderOverrides(pin_memory=True)
    assert plan_loader(loader_args(), ovr, ROOMY).message() == (
        "overrides change nothing: pin_memory not applied: no accelerator to pin memory for"
    )
    gpu = WorkerEnvironment(cpus=8, shm_bytes=8 << 30, accelerator=True)
    assert plan_loader(loader_args(), ovr, gpu).updates() == {"pin_memory": True}


def test_settings_missing_from_an_older_torch_are_not_applied() -> None:
    args = loader_args()
    del args["num_workers"]
    plan = plan_loader(args, LoaderOverrides(num_workers=2), ROOMY)
    assert plan.updates() == {}
    assert "num_workers not applied: not an argument of this DataLoader" in plan.message()


@pytest.mark.parametrize(
    "given",
    [
        {"prefetch_factor": 4},
        {"persistent_workers": True},
        {"multiprocessing_context": "spawn"},
        {"timeout": 5.0},
        {"num_workers": -1},
    ],
)
def test_the_codes_own_errors_are_not_hidden_by_adding_workers(given: dict[str, object]) -> None:
    # torch rejects each of these without workers; the override must not make a broken loader work.
    plan = plan_loader(
        loader_args(**given), LoaderOverrides(num_workers=2), ROOMY, spawn_check=no_spawn_check
    )
    assert plan.refused is not None
    assert plan.updates() == {}


def test_a_non_integer_worker_count_is_left_alone() -> None:
    plan = plan_loader(loader_args(num_workers="2"), LoaderOverrides(num_workers=4), ROOMY)
    assert plan.refused == "num_workers or prefetch_factor is not an integer"


# --- the spawn check with real pickling --------------------------------------------------------


def module_level_collate(batch: object) -> object:
    return batch


@pytest.fixture
def guarded_main(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    script = tmp_path / "train.py"
    script.write_text('def main():\n    pass\n\nif __name__ == "__main__":\n    main()\n')
    main = types.ModuleType("__main__")
    main.__file__ = str(script)
    monkeypatch.setitem(sys.modules, "__main__", main)
    return script


def test_spawn_check_accepts_importable_objects(guarded_main: Path) -> None:
    assert spawn_problem("spawn", {"dataset": MapData(), "collate_fn": module_level_collate}) is None


def test_spawn_check_names_the_argument_that_does_not_pickle(guarded_main: Path) -> None:
    problem = spawn_problem("spawn", {"dataset": MapData(), "collate_fn": lambda batch: batch})
    assert problem is not None
    assert problem.startswith("collate_fn is not picklable, which spawn workers need: ")
    with open(os.devnull, "rb") as handle:
        problem = spawn_problem("forkserver", {"dataset": {"file": handle}})
    assert problem is not None
    assert problem.startswith("dataset is not picklable, which forkserver workers need: TypeError")


def test_spawn_check_skips_tensors(guarded_main: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Tensor:  # a stand-in that only torch's own reducers could send
        def __reduce__(self) -> Any:
            raise TypeError("not without torch")

    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(Tensor=Tensor))
    assert spawn_problem("spawn", {"dataset": [Tensor(), Tensor()]}) is None


def test_spawn_check_refuses_a_main_module_without_a_guard(
    guarded_main: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    guarded_main.write_text("import torch\nloader = make()\nfor batch in loader:\n    pass\n")
    problem = spawn_problem("spawn", {"dataset": MapData()})
    assert (
        problem
        == 'train.py has no `if __name__ == "__main__":` guard, and spawn workers re-run the main module'
    )


def test_spawn_check_refuses_main_objects_when_there_is_no_main_file(monkeypatch: pytest.MonkeyPatch) -> None:
    main = types.ModuleType("__main__")  # python -c, a notebook: no __file__

    class Local(MapData):
        pass

    Local.__module__ = "__main__"
    Local.__qualname__ = "Local"
    main.Local = Local  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "__main__", main)
    problem = spawn_problem("spawn", {"dataset": Local()})
    assert problem == "objects defined in __main__, which spawn workers cannot import (no main file)"
    assert spawn_problem("spawn", {"dataset": MapData()}) is None


# --- the environment ------------------------------------------------------------------------


def test_worker_environment_reads_the_machine_without_fixing_the_start_method() -> None:
    before = multiprocessing.get_start_method(allow_none=True)
    env = worker_environment()
    assert multiprocessing.get_start_method(allow_none=True) == before
    assert env.cpus is not None and env.cpus >= 1
    assert env.default_start_method in multiprocessing.get_all_start_methods()
    assert env.daemon is False
    assert env.accelerator is False  # not asked for


# --- the patch on a loader-like class -------------------------------------------------------


def fake_module() -> types.ModuleType:
    """A module shaped like torch.utils.data.dataloader, with torch 2.13's DataLoader signature."""
    module = types.ModuleType("fake_dataloader")

    class DataLoader:
        def __init__(  # noqa: PLR0917 (torch's signature)
            self,
            dataset: object,
            batch_size: int | None = 1,
            shuffle: bool | None = None,
            sampler: object = None,
            batch_sampler: object = None,
            num_workers: int = 0,
            collate_fn: object = None,
            pin_memory: bool = False,
            drop_last: bool = False,
            timeout: float = 0,
            worker_init_fn: object = None,
            multiprocessing_context: object = None,
            generator: object = None,
            *,
            prefetch_factor: int | None = None,
            persistent_workers: bool = False,
            pin_memory_device: str = "",
            in_order: bool = True,
        ) -> None:
            if num_workers < 0:
                raise ValueError("num_workers option should be non-negative")
            self.dataset = dataset
            self.batch_size = batch_size
            self.num_workers = num_workers
            self.prefetch_factor = prefetch_factor
            self.persistent_workers = persistent_workers

    class IterableDataset:
        pass

    module.DataLoader = DataLoader  # type: ignore[attr-defined]
    module.IterableDataset = IterableDataset  # type: ignore[attr-defined]
    return module


OPT_IN = {ENV_LOADER_OVERRIDES: '{"version":1,"num_workers":2,"prefetch_factor":4}'}


def dam_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("dam-probe:")]


def test_the_patch_applies_the_overrides_and_says_so_once_per_call_site(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(overrides, "worker_environment", lambda **_: ROOMY)
    module = fake_module()
    assert patch_dataloader(module, OPT_IN) is True
    assert patch_dataloader(module, OPT_IN) is True  # idempotent: wrapped once
    assert module.DataLoader.__init__.__wrapped__.__name__ == "__init__"
    assert not hasattr(module.DataLoader.__init__.__wrapped__, "__wrapped__")
    loaders = [module.DataLoader(MapData(), 4) for _ in range(3)]
    line = sys._getframe().f_lineno - 1
    assert [(x.num_workers, x.prefetch_factor, x.batch_size) for x in loaders] == [(2, 4, 4)] * 3
    assert dam_lines(capsys.readouterr().err) == [
        f"dam-probe: DataLoader at {Path(__file__).relative_to(Path.cwd())}:{line}: "
        "num_workers 0 → 2, prefetch_factor None → 4"
    ]


def test_the_call_site_of_a_subclass_is_the_users_line_not_its_init(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(overrides, "worker_environment", lambda **_: ROOMY)
    module = fake_module()
    patch_dataloader(module, OPT_IN)

    class MyLoader(module.DataLoader):  # type: ignore[name-defined,misc]
        def __init__(self, dataset: object, **kw: Any) -> None:
            super().__init__(dataset, **kw)

    loader = MyLoader(MapData(), batch_size=2)
    line = sys._getframe().f_lineno - 1
    assert loader.num_workers == 2
    (said,) = dam_lines(capsys.readouterr().err)
    assert f"test_overrides.py:{line}: " in said


def test_a_refused_loader_is_built_as_written_and_the_reason_given(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(overrides, "worker_environment", lambda **_: ROOMY)
    module = fake_module()
    patch_dataloader(module, OPT_IN)
    loader = module.DataLoader(module.IterableDataset())
    assert (loader.num_workers, loader.prefetch_factor) == (0, None)
    (said,) = dam_lines(capsys.readouterr().err)
    assert ": overrides not applied: IterableDataset with num_workers=0" in said


def test_a_loader_that_rejects_the_overrides_is_built_as_written(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(overrides, "worker_environment", lambda **_: ROOMY)
    module = fake_module()
    orig = module.DataLoader.__init__

    @functools.wraps(orig)  # the signature stays torch's
    def picky(self: Any, dataset: object, *args: Any, prefetch_factor: int | None = None, **kw: Any) -> None:
        if prefetch_factor == 4:
            raise ValueError("no")
        orig(self, dataset, *args, prefetch_factor=prefetch_factor, **kw)

    module.DataLoader.__init__ = picky
    patch_dataloader(module, OPT_IN)
    loader = module.DataLoader(MapData())
    assert (loader.num_workers, loader.prefetch_factor) == (0, None)
    (said,) = dam_lines(capsys.readouterr().err)
    assert said.endswith("overrides not applied: torch refused them: ValueError: no")


def test_the_users_own_argument_errors_still_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(overrides, "worker_environment", lambda **_: ROOMY)
    module = fake_module()
    patch_dataloader(module, OPT_IN)
    with pytest.raises(TypeError):
        module.DataLoader(MapData(), no_such_argument=1)
    with pytest.raises(ValueError, match="non-negative"):
        module.DataLoader(MapData(), num_workers=-1)


@pytest.mark.parametrize("value", ["{not json", '{"version":9}', '{"version":1,"num_workers":-1}'])
def test_a_bad_variable_is_ignored_with_one_line_and_the_loader_untouched(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    module = fake_module()
    orig = module.DataLoader.__init__
    assert patch_dataloader(module, {ENV_LOADER_OVERRIDES: value}) is False
    assert patch_dataloader(module, {ENV_LOADER_OVERRIDES: value}) is False
    assert module.DataLoader.__init__ is orig
    (said,) = dam_lines(capsys.readouterr().err)
    assert said.startswith("dam-probe: ignoring DAM_LOADER_OVERRIDES: ")
    assert module.DataLoader(MapData()).num_workers == 0


def test_without_the_variable_nothing_is_patched_or_said(capsys: pytest.CaptureFixture[str]) -> None:
    module = fake_module()
    orig = module.DataLoader.__init__
    assert patch_dataloader(module, {}) is False
    assert module.DataLoader.__init__ is orig
    assert capsys.readouterr().err == ""


def test_a_module_without_a_dataloader_is_reported_not_raised(capsys: pytest.CaptureFixture[str]) -> None:
    assert patch_dataloader(types.ModuleType("empty"), OPT_IN) is False
    assert "DataLoader.__init__ not found" in capsys.readouterr().err


# --- torchdata's StatefulDataLoader ---------------------------------------------------------


def test_a_stateful_loaders_worker_count_is_kept_because_its_checkpoints_record_it() -> None:
    plan = plan_loader(
        loader_args(),
        LoaderOverrides(num_workers=4, prefetch_factor=4),
        ROOMY,
        spawn_check=no_spawn_check,
        num_workers_in_state=True,
    )
    assert plan.refused is None
    assert plan.updates() == {}
    assert overrides.STATEFUL_NUM_WORKERS in plan.notes
    assert "prefetch_factor not applied: needs num_workers > 0" in plan.notes


def test_a_stateful_loader_with_workers_gets_its_other_settings() -> None:
    plan = plan_loader(
        loader_args(num_workers=2),
        LoaderOverrides(num_workers=4, prefetch_factor=4),
        ROOMY,
        num_workers_in_state=True,
    )
    assert plan.updates() == {"prefetch_factor": 4}
    assert plan.notes == (overrides.STATEFUL_NUM_WORKERS,)


def test_the_import_hook_names_the_module_and_variable_the_overrides_use() -> None:
    from dam_probe import _autohook

    assert _autohook.STATEFUL_MODULE == overrides.STATEFUL_MODULE
    assert _autohook.ENV_LOADER_OVERRIDES == overrides.ENV_LOADER_OVERRIDES
    assert overrides.STATEFUL_MODULE in _autohook.PATCHES
