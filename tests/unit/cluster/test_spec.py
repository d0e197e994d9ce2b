"""The DAMProfile spec model: valid specs parse, bad ones name the field and the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from dam_operator.cluster.steps.spec import (
    IMAGE_PATTERN,
    QUANTITY_PATTERN,
    URL_PATTERN,
    DAMProfileSpec,
    LabelSelector,
    SpecError,
    _hint,
    label_selector_string,
    parse_spec,
    quantity_value,
    selector_matches,
)
from dam_operator.diagnosis.model import Hardware, Thresholds

ROOT = Path(__file__).resolve().parents[3]
SELECTOR = {"matchLabels": {"app": "trainer"}}


def _spec(**extra: Any) -> dict[str, Any]:
    return {"selector": SELECTOR, **extra}


def _error(raw: Any) -> SpecError:
    with pytest.raises(SpecError) as info:
        parse_spec(raw)
    return info.value


def test_example_profile_parses_with_its_overrides() -> None:
    doc = yaml.safe_load((ROOT / "examples" / "damprofile.yaml").read_text())
    spec = parse_spec(doc["spec"])
    assert spec.selector.match_labels == {"app": "trainer"}
    assert spec.thresholds_model().data_wait_suspect == 0.05
    # Every threshold the example does not set keeps the engine default.
    assert spec.thresholds_model().gpu_util_busy == Thresholds().gpu_util_busy
    assert spec.model is not None and spec.model.batch_size == 64


def test_minimal_spec_gets_the_documented_defaults() -> None:
    spec = parse_spec(_spec())
    assert spec.sampling.interval_seconds == 1.0
    assert spec.evaluation.window_seconds == 30.0
    assert spec.sidecar.port == 9450
    assert spec.sidecar.inject is True
    assert spec.thresholds_model() == Thresholds()
    assert spec.hardware_model() is None
    assert spec.prometheus_url() is None


def test_hardware_overrides_become_the_engine_hardware() -> None:
    spec = parse_spec(_spec(hardware={"gpuModel": "NVIDIA H200", "peakFlops": 9.89e14}))
    assert spec.hardware_model() == Hardware(gpu_model="NVIDIA H200", peak_flops=9.89e14)
    assert parse_spec(_spec(hardware={})).hardware_model() is None


@pytest.mark.parametrize(
    ("raw", "path", "fix"),
    [
        (
            _spec(sampling={"intervalSeconds": -1}),
            "spec.sampling.intervalSeconds",
            "between 0.1 and 3600, e.g. 1",
        ),
        (_spec(sampling={"intervalSeconds": "fast"}), "spec.sampling.intervalSeconds", "must be a number"),
        (_spec(sampling={"intervalSeconds": True}), "spec.sampling.intervalSeconds", "must be a number"),
        (_spec(evaluation={"hysteresisWindows": 1.5}), "spec.evaluation.hysteresisWindows", "whole number"),
        (_spec(sidecar={"port": 80}), "spec.sidecar.port", "between 1024 and 65535, e.g. 9450"),
        (_spec(thresholds={"gpuUtilBusy": 1.5}), "spec.thresholds.gpuUtilBusy", "between 0 and 1"),
        (_spec(hardware={"peakFlops": 0}), "spec.hardware.peakFlops", "above 0"),
        (_spec(hardware={"gpuModel": "H" * 1000}), "spec.hardware.gpuModel", "at most 64 characters"),
        (_spec(sidecar={"image": "x" * 600}), "spec.sidecar.image", "at most 512 characters"),
        (
            _spec(sidecar={"resources": {"limits": {"cpu": "lots"}}}),
            "spec.sidecar.resources.limits.cpu",
            "quantity",
        ),
        (
            _spec(source={"prometheus": {"url": "prometheus:9090"}}),
            "spec.source.prometheus.url",
            "http(s) URL",
        ),
        (_spec(sidecar={"imagePullPolicy": "Sometimes"}), "spec.sidecar.imagePullPolicy", "one of"),
        ({"selector": {}}, "spec.selector.matchLabels", "matchLabels: {app: trainer}"),
        ({"selector": {"matchLabels": {}}}, "spec.selector.matchLabels", "must not be empty"),
    ],
)
def test_bad_field_is_reported_with_its_path_and_fix(raw: dict[str, Any], path: str, fix: str) -> None:
    err = _error(raw)
    assert path in err.paths, str(err)
    assert fix in str(err)


def test_unknown_field_is_reported_with_the_known_names() -> None:
    err = _error(_spec(sampling={"intervalSecond": 2}))
    assert err.paths == ["spec.sampling.intervalSecond"]
    assert "intervalSeconds" in str(err)  # the field the user probably meant
    assert "spec.colour" in _error(_spec(colour="blue")).paths


def test_every_bad_field_is_reported_at_once() -> None:
    err = _error(_spec(sampling={"intervalSeconds": 0}, sidecar={"port": 1}))
    assert {"spec.sampling.intervalSeconds", "spec.sidecar.port"} <= set(err.paths)


def test_nan_interval_is_rejected() -> None:
    assert "spec.sampling.intervalSeconds" in _error(_spec(sampling={"intervalSeconds": float("nan")})).paths


def test_crossed_thresholds_are_rejected_even_against_defaults() -> None:
    # dataWaitFine above the default dataWaitSuspect (0.1) makes the pair contradictory.
    err = _error(_spec(thresholds={"dataWaitFine": 0.5}))
    assert "dataWaitFine" in str(err) and "dataWaitSuspect" in str(err)
    parse_spec(_spec(thresholds={"dataWaitFine": 0.5, "dataWaitSuspect": 0.6}))


def test_window_shorter_than_two_samples_is_rejected() -> None:
    err = _error(_spec(sampling={"intervalSeconds": 10}, evaluation={"windowSeconds": 15}))
    assert "windowSeconds" in str(err) and "twice" in str(err)


def test_sidecar_request_above_its_limit_is_rejected() -> None:
    err = _error(_spec(sidecar={"resources": {"requests": {"memory": "1Gi"}, "limits": {"memory": "128Mi"}}}))
    assert "spec.sidecar.resources" in err.paths
    assert "exceeds limits.memory" in str(err)


def test_integer_quantities_are_accepted_as_kubernetes_does() -> None:
    spec = parse_spec(_spec(sidecar={"resources": {"limits": {"cpu": 1, "memory": "256Mi"}}}))
    assert spec.sidecar.resources is not None
    assert spec.sidecar.resources.to_k8s() == {"limits": {"cpu": "1", "memory": "256Mi"}}


@pytest.mark.parametrize(
    ("quantity", "value"), [("100m", 0.1), ("1", 1.0), ("1Ki", 1024.0), ("2G", 2e9), ("1.5Gi", 1.5 * 2**30)]
)
def test_quantities_have_their_kubernetes_values(quantity: str, value: float) -> None:
    assert quantity_value(quantity) == pytest.approx(value)


@pytest.mark.parametrize("raw", [None, [], "spec"])
def test_spec_that_is_not_an_object_is_reported(raw: Any) -> None:
    assert _error(raw).paths == ["spec"]


def test_bad_label_key_and_selector_operator_are_reported() -> None:
    assert "bad key" in str(_error({"selector": {"matchLabels": {"bad key": "x"}}}))
    err = _error(
        _spec(selector={"matchLabels": {"a": "b"}, "matchExpressions": [{"key": "t", "operator": "In"}]})
    )
    assert err.paths == ["spec.selector.matchExpressions[0]"]
    assert "non-empty 'values'" in str(err)


def _selector(**raw: Any) -> LabelSelector:
    return LabelSelector.model_validate(raw, by_alias=True)


def test_selector_matches_labels_and_expressions() -> None:
    sel = _selector(
        matchLabels={"app": "trainer"},
        matchExpressions=[
            {"key": "tier", "operator": "In", "values": ["gpu", "tpu"]},
            {"key": "debug", "operator": "DoesNotExist"},
            {"key": "team", "operator": "Exists"},
            {"key": "stage", "operator": "NotIn", "values": ["test"]},
        ],
    )
    base = {"app": "trainer", "tier": "gpu", "team": "ml"}
    assert selector_matches(sel, base)
    assert selector_matches(sel, {**base, "stage": "prod"})
    assert not selector_matches(sel, {**base, "stage": "test"})
    assert not selector_matches(sel, {**base, "debug": "1"})
    assert not selector_matches(sel, {**base, "tier": "cpu"})
    assert not selector_matches(sel, {"app": "trainer", "tier": "gpu"})  # team missing
    assert not selector_matches(sel, None)


def test_label_selector_string_uses_kubernetes_syntax() -> None:
    sel = _selector(
        matchLabels={"app": "trainer", "a": "b"},
        matchExpressions=[
            {"key": "tier", "operator": "In", "values": ["gpu", "tpu"]},
            {"key": "stage", "operator": "NotIn", "values": ["test"]},
            {"key": "team", "operator": "Exists"},
            {"key": "debug", "operator": "DoesNotExist"},
        ],
    )
    assert label_selector_string(sel) == "a=b,app=trainer,tier in (gpu,tpu),stage notin (test),team,!debug"


_label = st.from_regex(r"[a-z][a-z0-9]{0,6}", fullmatch=True)


@given(st.dictionaries(_label, _label, min_size=1, max_size=4), st.dictionaries(_label, _label, max_size=6))
def test_match_labels_agree_with_subset_semantics(wanted: dict[str, str], labels: dict[str, str]) -> None:
    sel = _selector(matchLabels=wanted)
    assert selector_matches(sel, labels) == (wanted.items() <= labels.items())
    assert selector_matches(sel, {**labels, **wanted})


def test_spec_round_trips_through_its_wire_form() -> None:
    spec = parse_spec(_spec(thresholds={"mfuEfficient": 0.6}, model={"flopsPerStep": 1e12}))
    wire = spec.model_dump(by_alias=True, exclude_none=True)
    assert parse_spec(wire) == spec
    assert isinstance(spec, DAMProfileSpec)


def test_profiles_from_one_template_share_their_equal_parts_and_keep_their_own() -> None:
    def raw(job: str, window: float) -> dict[str, object]:
        return {
            "selector": {"matchLabels": {"job": job}},
            "evaluation": {"windowSeconds": window},
            "sidecar": {"port": 9450, "resources": {"limits": {"cpu": "100m"}}},
        }

    a, b, c = parse_spec(raw("a", 30)), parse_spec(raw("b", 30)), parse_spec(raw("c", 60))
    assert a.evaluation is b.evaluation and a.sampling is b.sampling  # one instance serves both
    assert c.evaluation is not a.evaluation and c.evaluation.window_seconds == 60
    assert a.selector.match_labels == {"job": "a"} and b.selector.match_labels == {"job": "b"}
    assert a.sidecar == b.sidecar  # shared or not (a part holding a mapping may be unhashable), equal


@pytest.mark.parametrize(
    ("kind", "ctx", "hint"),
    [
        ("string_too_long", {"max_length": 64}, "too long: at most 64 characters"),
        ("string_too_short", {}, "must not be empty"),
        ("string_pattern_mismatch", {"pattern": "^a+$"}, "must match ^a+$"),
        (
            "string_pattern_mismatch",
            {"pattern": URL_PATTERN},
            "must be an http(s) URL, e.g. http://prometheus.monitoring.svc:9090",
        ),
        (
            "string_pattern_mismatch",
            {"pattern": IMAGE_PATTERN},
            "must be a container image reference, e.g. ghcr.io/mlsys/dam-operator:0.1.0",
        ),
        (
            "string_pattern_mismatch",
            {"pattern": QUANTITY_PATTERN},
            "must be a Kubernetes quantity, e.g. 100m or 128Mi",
        ),
        ("string_type", {}, "must be a string"),
        ("str_type", {}, "must be a string"),
        ("bool_type", {}, "must be true or false"),
        ("bool_parsing", {}, "must be true or false"),
        ("dict_type", {}, "must be an object (a mapping of fields)"),
        ("model_type", {}, "must be an object (a mapping of fields)"),
        ("model_attributes_type", {}, "must be an object (a mapping of fields)"),
        ("list_type", {}, "must be a list"),
        ("too_long", {"max_length": 8}, "too many entries: at most 8"),
        ("too_long", {}, "too many entries: at most None"),
        ("too_short", {}, "must not be empty"),
        ("literal_error", {"expected": "'Always' or 'Never'"}, "must be one of 'Always' or 'Never'"),
        ("literal_error", {}, "must be one of "),
    ],
)
def test_each_kind_of_error_gets_its_own_fix(kind: str, ctx: dict[str, Any], hint: str) -> None:
    # A location no field answers to: only the error's kind and context make the hint.
    assert _hint({"loc": ("nowhere",), "type": kind, "ctx": ctx}) == hint


def test_an_error_of_no_known_kind_keeps_its_own_message() -> None:
    assert _hint({"loc": ("nowhere",), "type": "odd", "msg": "Value error, it is odd"}) == "it is odd"
