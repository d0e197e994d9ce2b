"""The DAMProfile CRD: structural, described, and in agreement with the spec model."""

from __future__ import annotations

import importlib.util
import re
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema
import pytest
import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from dam_operator.cluster.steps import actions
from dam_operator.cluster.steps.spec import DAMProfileSpec, ThresholdsSpec
from dam_operator.diagnosis import levers
from dam_operator.diagnosis.engine import diagnose
from dam_operator.diagnosis.model import (
    Axis,
    Bottleneck,
    IronLaw,
    Observation,
    Regime,
    Thresholds,
    WindowMetrics,
)
from dam_operator.diagnosis.signals import STATUS_SIGNALS, Unit

ROOT = Path(__file__).resolve().parents[3]
CRD = yaml.safe_load((ROOT / "crds" / "damprofile.yaml").read_text())
VERSION = CRD["spec"]["versions"][0]
SCHEMA = VERSION["schema"]["openAPIV3Schema"]
SPEC = SCHEMA["properties"]["spec"]
STATUS = SCHEMA["properties"]["status"]


def _nodes(node: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, child in (node.get("properties") or {}).items():
        yield from _nodes(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from _nodes(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _nodes(node["additionalProperties"], f"{path}{{}}")


def test_crd_names_the_resource_as_the_design_fixes_it() -> None:
    assert CRD["metadata"]["name"] == "damprofiles.dam.mlsys.dev"
    names = CRD["spec"]["names"]
    assert (names["kind"], names["plural"], names["singular"]) == ("DAMProfile", "damprofiles", "damprofile")
    assert "damp" in names["shortNames"]
    assert CRD["spec"]["scope"] == "Namespaced"
    assert [v["name"] for v in CRD["spec"]["versions"]] == ["v1alpha1"]
    assert VERSION["served"] and VERSION["storage"]
    assert VERSION["subresources"] == {"status": {}}


def test_every_schema_node_has_a_type() -> None:
    untyped = [
        path
        for path, node in _nodes(SCHEMA, "")
        if "type" not in node
        and not node.get("x-kubernetes-int-or-string")
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ]
    assert untyped == []


def test_int_or_string_nodes_use_the_one_structural_form() -> None:
    for path, node in _nodes(SCHEMA, ""):
        if node.get("x-kubernetes-int-or-string"):
            assert node.get("anyOf") == [{"type": "integer"}, {"type": "string"}], path


# A real kube-apiserver refuses anything but `type` under `metadata` ("must not specify
# anything other than name and generateName"); kubectl explain describes it from ObjectMeta.
SERVER_DESCRIBED = {".metadata"}


def test_every_field_is_described_for_kubectl_explain() -> None:
    undescribed = [
        path
        for path, node in _nodes(SCHEMA, "")
        if not path.endswith(("[]", "{}"))
        and path not in SERVER_DESCRIBED
        and not str(node.get("description", "")).strip()
    ]
    undescribed += [
        path
        for path, node in _nodes(SCHEMA, "")
        if path.endswith("[]") and node.get("type") == "object" and not node.get("description")
    ]
    assert undescribed == []


def test_printer_columns_show_axis_regime_lever_confidence_age() -> None:
    columns = {c["name"]: c for c in VERSION["additionalPrinterColumns"]}
    assert columns["Axis"]["jsonPath"] == ".status.bottleneck.axis"
    assert columns["Regime"]["jsonPath"] == ".status.bottleneck.regime"
    assert columns["Lever"]["jsonPath"] == ".status.bottleneck.lever"
    assert columns["Confidence"]["jsonPath"] == ".status.bottleneck.confidence"
    assert columns["Confidence"]["type"] == "number"
    assert columns["Age"] == {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
    for column in columns.values():  # every column points at a field the schema has
        parts = column["jsonPath"].strip(".").split(".")
        node = SCHEMA
        for part in parts if parts[0] != "metadata" else []:
            node = node["properties"][part]


# ---------------------------------------------------------------- model agreement


def _unwrap(annotation: Any) -> Any:
    """The non-None member of ``X | None``."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        assert len(members) == 1, annotation
        return members[0]
    return annotation


def _model_of(info: FieldInfo) -> type[BaseModel] | None:
    inner = _unwrap(info.annotation)
    return inner if isinstance(inner, type) and issubclass(inner, BaseModel) else None


def _constraint(info: FieldInfo, name: str) -> Any:
    metas = list(info.metadata)
    for arg in typing.get_args(info.annotation):
        metas.extend(getattr(arg, "__metadata__", ()))
    for meta in metas:
        for m in getattr(meta, "metadata", [meta]):
            if getattr(m, name, None) is not None:
                return getattr(m, name)
    return None


def _compare(model: type[BaseModel], node: dict[str, Any], path: str, problems: list[str]) -> None:
    props = node.get("properties") or {}
    fields = {(f.alias or n): f for n, f in model.model_fields.items()}
    for missing in sorted(set(props) - set(fields)):
        problems.append(f"{path}.{missing}: in the CRD, not in {model.__name__}")
    for missing in sorted(set(fields) - set(props)):
        problems.append(f"{path}.{missing}: in {model.__name__}, not in the CRD")
    required = set(node.get("required") or [])
    for name in sorted(set(props) & set(fields)):
        info, prop, where = fields[name], props[name], f"{path}.{name}"
        if (name in required) != info.is_required():
            problems.append(f"{where}: required in one, optional in the other")
        sub = _model_of(info)
        if "default" in prop:
            if sub is not None:
                if info.default_factory is None:
                    problems.append(f"{where}: CRD default {prop['default']} but the model has none")
            elif info.default != prop["default"]:
                problems.append(
                    f"{where}: default {info.default!r} in the model, {prop['default']!r} in the CRD"
                )
        elif not info.is_required() and info.default not in (None,) and info.default_factory is None:
            problems.append(f"{where}: the model defaults to {info.default!r}, the CRD has no default")
        lo = _constraint(info, "ge") if _constraint(info, "ge") is not None else _constraint(info, "gt")
        hi = _constraint(info, "le")
        if "minimum" in prop or lo is not None:
            if prop.get("minimum") != lo:
                problems.append(f"{where}: minimum {prop.get('minimum')} in the CRD, {lo} in the model")
            if bool(prop.get("exclusiveMinimum")) != (_constraint(info, "gt") is not None):
                problems.append(f"{where}: exclusiveMinimum differs")
        if ("maximum" in prop or hi is not None) and prop.get("maximum") != hi:
            problems.append(f"{where}: maximum {prop.get('maximum')} in the CRD, {hi} in the model")
        max_len = _constraint(info, "max_length")
        if prop.get("type") == "string" and prop.get("maxLength") != max_len:
            problems.append(f"{where}: maxLength {prop.get('maxLength')} in the CRD, {max_len} in the model")
        if "enum" in prop:
            literal = set(typing.get_args(_unwrap(info.annotation)))
            if literal != set(prop["enum"]):
                problems.append(f"{where}: enum {prop['enum']} in the CRD, {sorted(literal)} in the model")
        if sub is not None:
            _compare(sub, prop, where, problems)
        elif prop.get("type") == "array" and isinstance(prop.get("items"), dict):
            args = typing.get_args(_unwrap(info.annotation))
            item = _unwrap(args[0]) if args else None
            item = typing.get_args(item)[0] if typing.get_origin(item) is typing.Annotated else item
            if isinstance(item, type) and issubclass(item, BaseModel):
                _compare(item, prop["items"], f"{where}[]", problems)


def test_spec_model_and_crd_schema_agree() -> None:
    problems: list[str] = []
    _compare(DAMProfileSpec, SPEC, "spec", problems)
    assert problems == []


def test_threshold_overrides_cover_every_engine_threshold() -> None:
    assert set(ThresholdsSpec.model_fields) == set(Thresholds.model_fields)


def test_threshold_descriptions_state_the_engine_defaults() -> None:
    props = SPEC["properties"]["thresholds"]["properties"]
    defaults = Thresholds()
    for name, info in Thresholds.model_fields.items():
        prop = props[info.alias or name]
        assert "default" not in prop, f"{name}: CRD defaults would freeze today's value into stored objects"
        found = re.search(r"\(default ([0-9.]+)\)", prop["description"])
        assert found, f"{name}: the description does not state its default"
        assert float(found.group(1)) == getattr(defaults, name), name


def test_status_schema_holds_every_field_the_engine_writes() -> None:
    def aliases(model: type[BaseModel]) -> set[str]:
        return {f.alias or n for n, f in model.model_fields.items()}

    bottleneck = STATUS["properties"]["bottleneck"]["properties"]
    metrics = STATUS["properties"]["metrics"]["properties"]
    assert aliases(Bottleneck) <= set(bottleneck)
    assert set(WindowMetrics.status_keys()) <= set(metrics)
    assert aliases(IronLaw) <= set(metrics["ironLaw"]["properties"])
    assert {a.value for a in Axis} <= set(bottleneck["axis"]["enum"])
    assert {a.value for a in Axis} <= set(bottleneck["boundary"]["enum"])
    assert {r.value for r in Regime} <= set(bottleneck["regime"]["enum"])
    assert {"matched", "instrumented", "reporting"} <= set(STATUS["properties"]["pods"]["properties"])
    assert {"observedGeneration", "lastEvaluationTime", "conditions"} <= set(STATUS["properties"])


def test_status_enums_and_metrics_are_exactly_the_code_tables() -> None:
    """No more and no fewer: a status.metrics key no one writes is as wrong as a missing one
    (the API server prunes a key its schema lacks, silently)."""
    bottleneck = STATUS["properties"]["bottleneck"]["properties"]
    assert list(STATUS["properties"]["metrics"]["properties"]) == list(WindowMetrics.status_keys())
    for node in (bottleneck["axis"], bottleneck["boundary"], bottleneck["straggler"]["properties"]["cause"]):
        assert node["enum"] == [a.value for a in Axis]
    assert bottleneck["regime"]["enum"] == [r.value for r in Regime]
    action = STATUS["properties"]["actions"]["items"]["properties"]
    assert action["setting"]["properties"]["name"]["enum"] == list(levers.APPLY_SETTINGS)
    assert action["outcome"]["enum"] == list(actions.OUTCOMES)
    assert action["inPlace"]["properties"]["state"]["enum"] == ["Resized", "Partial", "Refused"]
    metrics = STATUS["properties"]["metrics"]["properties"]
    for key, sig in STATUS_SIGNALS.items():
        assert metrics[key]["description"] == sig.description, key


def test_every_signal_the_status_shows_is_valid_against_its_schema() -> None:
    """Each shown signal set (a value of its Observation type): the engine's status.metrics
    validates, so a key typed integer in the CRD holds an int, a number a float."""
    values: dict[str, Any] = {}
    for sig in STATUS_SIGNALS.values():
        integer = "int" in str(Observation.model_fields[sig.name].annotation)
        choices = re.findall(r"Literal\[['\"]([^'\"]+)", str(Observation.model_fields[sig.name].annotation))
        text = choices[0] if choices else "measured"
        values[sig.name] = text if sig.unit is Unit.TEXT else (3 if integer else 0.5)
    metrics = diagnose(Observation.model_validate(values)).to_status()["metrics"]
    assert set(STATUS_SIGNALS) <= set(metrics)
    schema = jsonschema.Draft4Validator(STATUS["properties"]["metrics"])
    assert list(schema.iter_errors(metrics)) == []
    assert list(schema.iter_errors({**metrics, "workerCount": 0.5}))  # integer, not any number


# ---------------------------------------------------------------- generated from the code


def _render_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dam_deploy_render_crd", ROOT / "deploy" / "render.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_crd_generated_parts_are_current_with_the_code() -> None:
    text = (ROOT / "crds" / "damprofile.yaml").read_text()
    assert _render_module().render_crd(text) == text, "crds/damprofile.yaml is stale: run deploy/render.py"


def test_render_check_fails_on_a_stale_crd_and_a_render_mends_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    render = _render_module()
    text = (ROOT / "crds" / "damprofile.yaml").read_text()
    regimes = [r.value for r in Regime]
    stale = text.replace(", ".join(regimes), ", ".join(regimes[:-1]))
    assert stale != text
    crd = tmp_path / "crds" / "damprofile.yaml"
    crd.parent.mkdir()
    crd.write_text(stale)
    monkeypatch.setattr(render, "ROOT", tmp_path)
    monkeypatch.setattr(render, "CRD", crd)
    monkeypatch.setattr(render, "render_files", dict)  # deploy/ is test_deploy.py's (needs Helm)
    assert render.main(["--check"]) == 1
    assert crd.read_text() == stale, "--check writes nothing"
    assert render.main([]) == 0
    assert crd.read_text() == text
    assert render.main(["--check"]) == 0


def test_a_key_written_by_hand_and_generated_is_refused() -> None:
    render = _render_module()
    text = (ROOT / "crds" / "damprofile.yaml").read_text()
    twice = text.replace(
        "                    # end generated: status-metrics\n",
        "                    # end generated: status-metrics\n"
        "                    dataWaitRatio:\n                      type: number\n"
        "                      description: by hand.\n",
    )
    with pytest.raises(ValueError, match="keys written twice"):
        render.render_crd(twice)


def test_conditions_are_a_map_keyed_by_type() -> None:
    conditions = STATUS["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    item = conditions["items"]["properties"]
    assert {"type", "status", "reason", "message", "lastTransitionTime", "observedGeneration"} <= set(item)


# ---------------------------------------------------------------- the schema validates documents

# Kubernetes structural schemas use OpenAPI 3.0 keywords (boolean exclusiveMinimum): Draft 4 semantics.
VALIDATOR = jsonschema.Draft4Validator(SCHEMA)


def _doc(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "dam.mlsys.dev/v1alpha1",
        "kind": "DAMProfile",
        "metadata": {"name": "p"},
        "spec": spec,
    }


def test_example_profile_is_valid_against_the_crd() -> None:
    example = yaml.safe_load((ROOT / "examples" / "damprofile.yaml").read_text())
    assert list(VALIDATOR.iter_errors(example)) == []


@pytest.mark.parametrize(
    "spec",
    [
        {},
        {"selector": {"matchLabels": {}}},
        {"selector": {"matchLabels": {"app": "t"}}, "sampling": {"intervalSeconds": 0}},
        {"selector": {"matchLabels": {"app": "t"}}, "sidecar": {"port": 99999}},
        {"selector": {"matchLabels": {"app": "t"}}, "thresholds": {"gpuUtilBusy": 2}},
        {"selector": {"matchLabels": {"app": "t"}}, "hardware": {"peakFlops": 0}},
        {"selector": {"matchLabels": {"app": "t"}}, "sidecar": {"resources": {"limits": {"cpu": "lots"}}}},
    ],
)
def test_crd_schema_rejects_what_the_model_rejects(spec: dict[str, Any]) -> None:
    assert list(VALIDATOR.iter_errors(_doc(spec))), spec


def test_status_written_by_the_engine_is_valid() -> None:
    bottleneck = Bottleneck(
        axis=Axis.DATA,
        boundary=Axis.MACHINE,
        regime=Regime.INPUT_BOUND,
        lever="increase-dataloader-workers",
        lever_detail="Raise num_workers.",
        confidence=0.8,
        evidence=["data wait 40 %"],
    )
    status = {
        "bottleneck": bottleneck.model_dump(by_alias=True, exclude_none=True, mode="json"),
        "metrics": WindowMetrics(data_wait_ratio=0.4, iron_law=IronLaw(step_seconds=0.1)).model_dump(
            by_alias=True, exclude_none=True
        ),
        "pods": {"matched": 2, "instrumented": 2, "reporting": 1},
        "conditions": [{"type": "Diagnosed", "status": "True", "reason": "Verdict", "message": "ok"}],
        "observedGeneration": 3,
    }
    doc = {**_doc({"selector": {"matchLabels": {"app": "t"}}}), "status": status}
    assert list(VALIDATOR.iter_errors(doc)) == []
    doc["status"]["bottleneck"]["axis"] = "Network"
    assert list(VALIDATOR.iter_errors(doc))
