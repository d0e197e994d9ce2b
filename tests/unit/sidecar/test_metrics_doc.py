"""Every metric name in names.py is one declaration, and docs/metrics.md is generated from them."""

from __future__ import annotations

import dataclasses
import importlib.util
import typing
from pathlib import Path
from types import ModuleType

import pytest

from dam_contract import names
from dam_contract.names import BY_NAME, CATALOG, MetricSpec
from dam_probe.layout import RANK_TOTALS, total_key
from dam_sidecar import catalog
from dam_sidecar.collectors.base import read_field
from dam_sidecar.collectors.host import HostReading
from dam_sidecar.samplers.nvml import GpuSample
from dam_sidecar.samplers.probe import RankSample

ROOT = Path(__file__).resolve().parents[3]


def load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_metrics_doc", ROOT / "tools" / "gen_metrics_doc.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_metric_name_has_a_catalog_entry_with_help() -> None:
    declared = {
        v for k, v in vars(names).items() if k.isupper() and isinstance(v, str) and v.startswith("dam_")
    }
    assert declared == set(BY_NAME)
    assert len(CATALOG) == len(BY_NAME), "a name declared twice"
    assert all(m.help.strip() for m in CATALOG)
    assert all(type(v) is str for v in declared), "the names stay plain str"


def test_the_old_catalog_path_gives_the_declarations() -> None:
    assert catalog.CATALOG is CATALOG
    assert catalog.BY_NAME is BY_NAME


# The sample whose fields each source's collector reads (dam_sidecar.collectors).
SAMPLE_TYPES: dict[str, type] = {
    "nvml": GpuSample,
    "gpm": GpuSample,
    "cpu": HostReading,
    "memory": HostReading,
    "probe": RankSample,
}
# The keys of RankSample.totals: what the sidecar sums per rank from the probe's field table.
RANK_TOTAL_KEYS = {total_key(name, unit) for name, unit in RANK_TOTALS}


def field_names(kind: object) -> set[str]:
    assert dataclasses.is_dataclass(kind), kind
    return {f.name for f in dataclasses.fields(kind)}


@pytest.mark.parametrize("spec", [m for m in CATALOG if m.sample], ids=lambda m: m.name)
def test_every_declared_sample_field_is_a_field_of_its_collector_sample(spec: MetricSpec) -> None:
    assert spec.source in SAMPLE_TYPES, f"{spec.name}: no collector reads fields of {spec.source!r}"
    sample = SAMPLE_TYPES[spec.source]
    pairs = [("", spec.sample)] if isinstance(spec.sample, str) else list(spec.sample)
    for _, path in pairs:
        head, _, rest = path.partition(".")
        assert head in field_names(sample), f"{spec.name}: {path}"
        nested = typing.get_type_hints(sample)[head]
        if rest and dataclasses.is_dataclass(nested):  # else a key of a dict field (gpm)
            assert rest in field_names(nested), f"{spec.name}: {path}"
        if head == "totals":
            assert rest in RANK_TOTAL_KEYS, f"{spec.name}: {path} is not a summed probe field"
    if not isinstance(spec.sample, str):  # one series per pair, told apart by the last label
        assert len({label for label, _ in spec.sample}) == len(spec.sample) > 1
        assert spec.labels, spec.name


def test_a_field_reads_attributes_and_dict_keys_and_refuses_what_is_not_a_number() -> None:
    gpu = GpuSample(index=0, uuid="u", power_watts=300, gpm={"sm_active": 0.5})
    assert read_field(gpu, "power_watts") == 300.0
    assert read_field(gpu, "gpm.sm_active") == 0.5
    assert read_field(gpu, "gpm.tensor_active") is None
    assert read_field(gpu, "temperature_celsius") is None
    with pytest.raises(ValueError):
        read_field(gpu, "uuid")
    with pytest.raises(AttributeError):
        read_field(gpu, "no_such_field")


def test_counters_end_in_total_and_ratios_are_gauges() -> None:
    for m in CATALOG:
        assert (m.kind == "counter") == m.name.endswith("_total"), m.name
        if m.name.endswith("_ratio"):
            assert m.kind == "gauge"


def test_docs_metrics_md_is_up_to_date() -> None:
    tool = load_tool()
    current = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    assert current == tool.render_markdown(), "docs/metrics.md is stale: run tools/gen_metrics_doc.py"


def test_every_declared_metric_has_its_row_in_the_generated_reference() -> None:
    tool = load_tool()
    assert set(tool.SECTIONS) == set(typing.get_args(names.Source)), "a source without its section"
    text = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    missing = [m.name for m in CATALOG if f"| `{m.name}` |" not in text]
    assert not missing, missing


def test_every_operator_metric_name_is_in_the_generated_reference() -> None:
    from dam_operator.cluster.steps import metric_names

    text = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    declared = {
        v
        for k, v in vars(metric_names).items()
        if k.isupper() and isinstance(v, str) and v.startswith("dam_")
    }
    assert declared, "metric_names declares the operator's metrics"
    for name in declared:
        assert f"`{name}`" in text, f"{name} is missing from docs/metrics.md"
