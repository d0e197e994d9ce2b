"""spec.thresholds and spec.hardware are declared once (``diagnosis.observation.Thresholds`` and
``Hardware``): ``ThresholdsSpec``, ``HardwareSpec`` and the CRD's schema of them are written from
that declaration by deploy/render.py, and ``--check`` fails when they were not rewritten."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import jsonschema
import pytest
import yaml
from pydantic import BaseModel, Field, create_model

from dam_operator.cluster.steps import overrides
from dam_operator.cluster.steps.spec import SpecError, ThresholdsSpec, parse_spec
from dam_operator.diagnosis.model import Hardware, Thresholds
from dam_operator.diagnosis.observation import Ratio

ROOT = Path(__file__).resolve().parents[3]
CRD_PATH = ROOT / "crds" / "damprofile.yaml"
SPEC_PATH = ROOT / "operator" / "dam_operator" / "cluster" / "steps" / "spec.py"


def _render_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "dam_deploy_render_overrides", ROOT / "deploy" / "render.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _spec_props(crd_text: str, part: str) -> dict[str, dict[str, object]]:
    crd = yaml.safe_load(crd_text)
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    props: dict[str, dict[str, object]] = schema["properties"]["spec"]["properties"][part]["properties"]
    return props


def test_the_spec_models_generated_fields_are_current_with_the_declaration() -> None:
    text = SPEC_PATH.read_text()
    assert _render_module().render_spec(text) == text, "spec.py is stale: run deploy/render.py"


def test_the_crd_states_each_declared_description_and_default() -> None:
    props = _spec_props(CRD_PATH.read_text(), "thresholds")
    for name, info in Thresholds.model_fields.items():
        assert info.description, name
        text = props[info.alias or name]["description"]
        assert text == f"{info.description.removesuffix('.')} (default {info.default:g}).", name
    hardware = _spec_props(CRD_PATH.read_text(), "hardware")
    assert [p["description"] for p in hardware.values()] == [
        f.description for f in Hardware.model_fields.values()
    ]


def test_the_spec_keeps_its_own_hardware_bounds_over_the_engines() -> None:
    """The engine takes any positive peak; a profile's is at most 1e18 (a unit slip beyond), and a
    model name it gives is not empty: in the spec model and the CRD alike."""
    props = _spec_props(CRD_PATH.read_text(), "hardware")
    assert props["peakFlops"]["maximum"] == 1e18
    assert props["gpuModel"]["minLength"] == 1
    Hardware(peak_flops=1e19, gpu_model="")  # the engine's own bounds are untouched
    selector = {"matchLabels": {"app": "t"}}
    with pytest.raises(
        SpecError, match=r"spec.hardware.peakFlops: must be a number above 0 and at most 1e\+18"
    ):
        parse_spec({"selector": selector, "hardware": {"peakFlops": 1e19}})
    with pytest.raises(SpecError, match=r"spec.hardware.gpuModel: must not be empty"):
        parse_spec({"selector": selector, "hardware": {"gpuModel": ""}})


def _declared_with_a_new_threshold() -> type[BaseModel]:
    return create_model(
        "Thresholds",
        __base__=Thresholds,
        example_new_threshold=(Ratio, Field(0.9, description="GPU utilization under a power brake.")),
    )


def test_a_threshold_declared_without_regenerating_fails_the_check_and_a_render_writes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    render = _render_module()
    crd, spec = tmp_path / "crds" / "damprofile.yaml", tmp_path / "spec.py"
    crd.parent.mkdir()
    crd.write_text(CRD_PATH.read_text())
    spec.write_text(SPEC_PATH.read_text())
    monkeypatch.setattr(render, "ROOT", tmp_path)
    monkeypatch.setattr(render, "CRD", crd)
    monkeypatch.setattr(render, "SPEC", spec)
    monkeypatch.setattr(render, "render_files", dict)  # deploy/ is test_deploy.py's (needs Helm)
    assert render.main(["--check"]) == 0
    monkeypatch.setitem(render.DECLARATIONS, "thresholds", (_declared_with_a_new_threshold(), {}))

    assert render.main(["--check"]) == 1
    assert "out of date: spec.py, crds/damprofile.yaml" in capsys.readouterr().err
    assert crd.read_text() == CRD_PATH.read_text() and spec.read_text() == SPEC_PATH.read_text()

    assert render.main([]) == 0
    assert (
        "    example_new_threshold: Ratio | None = None\n    # end generated: thresholds-spec"
        in spec.read_text()
    )
    prop = _spec_props(crd.read_text(), "thresholds")["exampleNewThreshold"]
    assert prop == {
        "type": "number",
        "description": "GPU utilization under a power brake (default 0.9).",
        "minimum": 0,
        "maximum": 1,
    }
    assert list(jsonschema.Draft4Validator(prop).iter_errors(1.5))
    assert render.main(["--check"]) == 0


def test_a_declared_field_without_a_description_or_a_limit_for_no_field_is_refused() -> None:
    bare = create_model("Bare", __base__=Thresholds, bare=(Ratio, 0.5))
    with pytest.raises(ValueError, match=r"Bare.bare: no description"):
        overrides.overrides(bare)
    with pytest.raises(ValueError, match=r"limits for no field of Hardware: \['peak'\]"):
        overrides.overrides(Hardware, {"peak": {"le": 1.0}})


def test_every_threshold_the_spec_overrides_is_written_as_ruff_formats_it() -> None:
    """A long field goes on three lines, its type in parentheses (ruff's form, so that ``ruff
    format`` and the render never disagree); ``ThresholdsSpec`` has every declared field."""
    row = overrides.Override("x" * 80, "x", float, {"gt": 0.5, "le": 1.0}, 0.9, "d.")
    assert overrides.model_lines(row) == [
        f"{'x' * 80}: (",
        "    Annotated[float, Field(gt=0.5, le=1.0), AfterValidator(_finite)] | None",
        ") = None",
    ]
    assert list(ThresholdsSpec.model_fields) == list(Thresholds.model_fields)
