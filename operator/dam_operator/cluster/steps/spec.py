"""The DAMProfile spec: pydantic models mirroring ``crds/damprofile.yaml``.

``parse_spec`` turns the raw ``spec`` mapping of a DAMProfile into a
``DAMProfileSpec`` or raises ``SpecError`` whose message names each bad field
(``spec.sampling.intervalSeconds``) and the fix. Unknown fields are errors here
(``extra="forbid"``): a real API server prunes them before they reach the
operator, so one that gets through came from a client that skipped the schema
(or a CRD older than the operator) and is reported rather than ignored.

Wire names are camelCase (``intervalSeconds``); Python names are snake_case.
Pure: no I/O, no Kubernetes client.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic.fields import FieldInfo

from dam_operator.cluster.steps.urlpolicy import FIELD, UrlPolicy
from dam_operator.diagnosis.model import Hardware, Thresholds
from dam_operator.diagnosis.progress import (
    STALL_AFTER_SECONDS_DEFAULT,
    STALL_STEP_MULTIPLE_DEFAULT,
    StallSettings,
)

__all__ = [
    "ActionsSpec",
    "DAMProfileSpec",
    "EvaluationSpec",
    "HardwareSpec",
    "LabelSelector",
    "LabelSelectorRequirement",
    "ModelSpec",
    "PrometheusSourceSpec",
    "ResourceList",
    "ResourceRequirements",
    "SamplingSpec",
    "SidecarSpec",
    "SourceSpec",
    "SpecError",
    "SpecProblem",
    "ThresholdsSpec",
    "label_selector_string",
    "parse_spec",
    "quantity_value",
    "selector_matches",
]

# Limits shared with the CRD schema (tests/unit/cluster/test_crd.py checks they agree).
MAX_LABELS = 64
MAX_EXPRESSIONS = 32
MAX_EXPRESSION_VALUES = 64
MAX_IMAGE_LENGTH = 512
MAX_URL_LENGTH = 2048
MAX_PEAK_FLOPS = 1e18  # 1 EFLOP/s per accelerator: far above any device, catches unit slips
MAX_BANDWIDTH = 1e15  # 1 PB/s per accelerator

LABEL_NAME_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(LABEL_NAME_PATTERN)
QUANTITY_PATTERN = (
    r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
IMAGE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]*$"
URL_PATTERN = r"^https?://[^\s]+$"
URL_POLICY = "url_policy"  # the validation context's key for the admin's UrlPolicy


class _Spec(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        strict=True,  # as the CRD schema: no "1" for 1, no true for 1
    )


def _finite(v: float) -> float:
    if math.isnan(v) or math.isinf(v):
        raise ValueError("must be a finite number")
    return v


def _label_key(key: str) -> str:
    if not key or len(key) > 317:
        raise ValueError("label key must be 1–317 characters")
    prefix, sep, name = key.rpartition("/")
    if sep and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        raise ValueError(f"label key {key!r} has an invalid prefix (a DNS subdomain, at most 253 characters)")
    if not name or len(name) > 63 or not _LABEL_NAME.match(name):
        raise ValueError(
            f"label key {key!r} is invalid (at most 63 letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit)"
        )
    return key


def _label_value(value: str) -> str:
    if len(value) > 63 or not _LABEL_NAME.match(value):
        raise ValueError(
            f"label value {value!r} is invalid (at most 63 letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit)"
        )
    return value


def _quantity(v: Any) -> Any:
    # YAML gives ``cpu: 1`` as an int; Kubernetes accepts both.
    if isinstance(v, bool):
        return v
    if isinstance(v, int):
        return str(v)
    return v


LabelKey = Annotated[str, Field(max_length=317), AfterValidator(_label_key)]
LabelValue = Annotated[str, AfterValidator(_label_value)]
Quantity = Annotated[str, BeforeValidator(_quantity), Field(max_length=64, pattern=QUANTITY_PATTERN)]
Ratio = Annotated[float, Field(ge=0.0, le=1.0), AfterValidator(_finite)]


class LabelSelectorRequirement(_Spec):
    """One ``matchExpressions`` entry, as in a Kubernetes label selector."""

    key: LabelKey
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: Annotated[list[LabelValue], Field(max_length=MAX_EXPRESSION_VALUES)] = Field(default_factory=list)

    @model_validator(mode="after")
    def _values_fit_operator(self) -> LabelSelectorRequirement:
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"operator {self.operator} needs a non-empty 'values' list")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"operator {self.operator} takes no 'values'; remove them")
        return self


class LabelSelector(_Spec):
    """The training pods: ``matchLabels`` (required, not empty) and optional ``matchExpressions``."""

    match_labels: Annotated[dict[LabelKey, LabelValue], Field(min_length=1, max_length=MAX_LABELS)]
    match_expressions: Annotated[list[LabelSelectorRequirement], Field(max_length=MAX_EXPRESSIONS)] = Field(
        default_factory=list
    )


class SamplingSpec(_Spec):
    interval_seconds: Annotated[float, Field(ge=0.1, le=3600.0), AfterValidator(_finite)] = 1.0


class EvaluationSpec(_Spec):
    window_seconds: Annotated[float, Field(ge=5.0, le=86400.0), AfterValidator(_finite)] = 30.0
    hysteresis_windows: Annotated[int, Field(ge=1, le=100)] = 2
    stall_after_seconds: Annotated[float, Field(ge=5.0, le=604800.0), AfterValidator(_finite)] = (
        STALL_AFTER_SECONDS_DEFAULT
    )
    """A job is stalled when no rank took a batch for this long (the floor) ..."""
    stall_step_multiple: Annotated[float, Field(ge=1.0, le=1000.0), AfterValidator(_finite)] = (
        STALL_STEP_MULTIPLE_DEFAULT
    )
    """... and for this many median steps (``diagnosis.progress.StallSettings``)."""

    def stall_settings(self) -> StallSettings:
        return StallSettings(after_seconds=self.stall_after_seconds, step_multiple=self.stall_step_multiple)


HARDWARE_LIMITS: dict[str, dict[str, float]] = {
    "gpu_model": {"min_length": 1},
    "peak_flops": {"le": MAX_PEAK_FLOPS},
    "memory_bandwidth_bytes_per_second": {"le": MAX_BANDWIDTH},
}
"""The spec's bounds on ``spec.hardware`` beyond the engine's ``Hardware`` (a name, when given, is
not empty; a peak beyond these is a unit slip), in HardwareSpec and the CRD alike."""


class HardwareSpec(_Spec):
    """Overrides of the accelerator's peak figures (``diagnosis.model.Hardware``)."""

    # generated: hardware-spec (deploy/render.py, from Hardware and HARDWARE_LIMITS)
    gpu_model: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    peak_flops: Annotated[float, Field(gt=0.0, le=1e18), AfterValidator(_finite)] | None = None
    memory_bandwidth_bytes_per_second: (
        Annotated[float, Field(gt=0.0, le=1e15), AfterValidator(_finite)] | None
    ) = None
    # end generated: hardware-spec


class ThresholdsSpec(_Spec):
    """Overrides of the screening thresholds; a field left out takes the engine's default
    (``diagnosis.model.Thresholds``), so improved defaults reach existing profiles."""

    # generated: thresholds-spec (deploy/render.py, from diagnosis.observation.Thresholds)
    data_wait_suspect: Ratio | None = None
    data_wait_fine: Ratio | None = None
    gpu_util_starved: Ratio | None = None
    gpu_util_busy: Ratio | None = None
    sm_active_busy: Ratio | None = None
    dram_bandwidth_saturated: Ratio | None = None
    mfu_investigate: Ratio | None = None
    mfu_efficient: Ratio | None = None
    main_cpu_saturated_cores: Annotated[float, Field(gt=0.0, le=4.0), AfterValidator(_finite)] | None = None
    cpu_throttled_suspect: Ratio | None = None
    cpu_wait_suspect: Ratio | None = None
    tensor_active_low: Ratio | None = None
    worker_cpu_saturated: Ratio | None = None
    min_steps: Annotated[int, Field(ge=1, le=1000000)] | None = None
    communication_suspect: Ratio | None = None
    straggler_skew: Ratio | None = None
    gpu_memory_full: Annotated[float, Field(gt=0.5, le=1.0), AfterValidator(_finite)] | None = None
    container_memory_full: Annotated[float, Field(gt=0.5, le=1.0), AfterValidator(_finite)] | None = None
    checkpoint_suspect: Ratio | None = None
    # end generated: thresholds-spec

    def merged(self) -> Thresholds:
        return Thresholds(**self.model_dump(exclude_none=True))

    @model_validator(mode="after")
    def _ordered(self) -> ThresholdsSpec:
        t = self.merged()
        pairs = (
            ("dataWaitFine", t.data_wait_fine, "dataWaitSuspect", t.data_wait_suspect),
            ("gpuUtilStarved", t.gpu_util_starved, "gpuUtilBusy", t.gpu_util_busy),
            ("mfuInvestigate", t.mfu_investigate, "mfuEfficient", t.mfu_efficient),
        )
        for low_name, low, high_name, high in pairs:
            if low >= high:
                raise ValueError(
                    f"{low_name} ({low:g}) must be below {high_name} ({high:g}); "
                    "set both or raise the higher one"
                )
        return self


class ResourceList(_Spec):
    cpu: Quantity | None = None
    memory: Quantity | None = None
    ephemeral_storage: Quantity | None = Field(default=None, alias="ephemeral-storage")

    def to_k8s(self) -> dict[str, str]:
        return {k: v for k, v in self.model_dump(by_alias=True, exclude_none=True).items()}


_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}


def quantity_value(quantity: str) -> float:
    """The number a Kubernetes quantity stands for (``100m`` → 0.1, ``1Ki`` → 1024)."""
    if quantity[-2:] in _BINARY:
        return float(quantity[:-2]) * _BINARY[quantity[-2:]]
    if quantity[-1:] in _DECIMAL:
        return float(quantity[:-1]) * _DECIMAL[quantity[-1:]]
    return float(quantity)


class ResourceRequirements(_Spec):
    """Used as given: when set, the operator's defaults do not mix in."""

    requests: ResourceList | None = None
    limits: ResourceList | None = None

    @model_validator(mode="after")
    def _requests_within_limits(self) -> ResourceRequirements:
        requests = self.requests.to_k8s() if self.requests else {}
        limits = self.limits.to_k8s() if self.limits else {}
        for key, request in requests.items():
            if key in limits and quantity_value(request) > quantity_value(limits[key]):
                raise ValueError(
                    f"requests.{key} ({request}) exceeds limits.{key} ({limits[key]}); "
                    "lower the request or raise the limit"
                )
        return self

    def to_k8s(self) -> dict[str, dict[str, str]]:
        out: dict[str, dict[str, str]] = {}
        if self.requests is not None and self.requests.to_k8s():
            out["requests"] = self.requests.to_k8s()
        if self.limits is not None and self.limits.to_k8s():
            out["limits"] = self.limits.to_k8s()
        return out


class SidecarSpec(_Spec):
    inject: bool = True
    image: Annotated[str, Field(min_length=1, max_length=MAX_IMAGE_LENGTH, pattern=IMAGE_PATTERN)] | None = (
        None
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = None
    port: Annotated[int, Field(ge=1024, le=65535)] = 9450
    resources: ResourceRequirements | None = None
    share_process_namespace: bool = False
    """Ask for ``shareProcessNamespace: true`` in the pods (only where the chart allows it:
    ``injection.sidecar_refusals``); off, the probe publishes what the sidecar would read."""


class PrometheusSourceSpec(_Spec):
    url: Annotated[str, Field(max_length=MAX_URL_LENGTH, pattern=URL_PATTERN)]
    timeout_seconds: Annotated[float, Field(gt=0.0, le=60.0), AfterValidator(_finite)] = 5.0

    @field_validator("url")
    @classmethod
    def _allowed(cls, url: str, info: ValidationInfo) -> str:
        """The cluster admin's rules on which Prometheus a profile may use (urlpolicy.py), when
        ``parse_spec`` is given them: a refused URL is an invalid spec, and no request is sent."""
        policy = (info.context or {}).get(URL_POLICY) if isinstance(info.context, Mapping) else None
        if isinstance(policy, UrlPolicy):
            problem = policy.check_url(url)
            if problem is not None:
                raise ValueError(problem.removeprefix(f"{FIELD}: "))
        return url


class SourceSpec(_Spec):
    prometheus: PrometheusSourceSpec | None = None


class ModelSpec(_Spec):
    batch_size: Annotated[int, Field(ge=1, le=10**9)] | None = None
    flops_per_step: Annotated[float, Field(gt=0.0, le=1e24), AfterValidator(_finite)] | None = None


def _positive_quantity(v: str) -> str:
    if quantity_value(v) <= 0:
        raise ValueError("must be a CPU quantity above 0, e.g. 4 or 3500m")
    return v


class ActionsSpec(_Spec):
    """Closing the loop (docs/automation.md): whether and how the operator applies the
    input-pipeline lever to new pods of the job, measures it and keeps or rolls it back."""

    mode: Literal["Recommend", "Apply", "InPlace"] = "Recommend"
    """Recommend: only write the verdict. Apply: the webhook applies the current action to the
    next pod created for the job. InPlace: Apply, and a CPU raise also resizes running pods."""
    max_cpu: Annotated[Quantity, AfterValidator(_positive_quantity)] | None = None
    """Cap of a CPU raise of the training container; without it the CPU is never raised."""
    min_confidence: Ratio = 0.6
    """Actions are planned only from a verdict at least this confident."""
    max_workers: Annotated[int, Field(ge=1, le=256)] = 16
    """Highest DataLoader num_workers the climb may set (also bounded by the CPU limit)."""
    max_prefetch_factor: Annotated[int, Field(ge=2, le=64)] = 8
    """Highest prefetch_factor the climb may set."""
    noise_margin: Annotated[float, Field(ge=0.01, le=0.5), AfterValidator(_finite)] = 0.10
    """Improved when steps/s ≥ before × (1 + margin); worse when ≤ before × (1 − margin)."""
    warmup_windows: Annotated[int, Field(ge=0, le=10)] = 1
    """Full windows of a pod that carries an action ignored before it is measured."""
    on_stall: Literal["None", "Restart"] = "None"
    """Restart: delete a stalled job's running Pods (their controller recreates them) once the
    stall has lasted ``restart_grace_seconds`` more; only where the chart grants pods/delete."""
    restart_grace_seconds: Annotated[float, Field(ge=0.0, le=86400.0), AfterValidator(_finite)] = 60.0
    """How long a stall must last past its detection before ``onStall: Restart`` deletes Pods."""


class DAMProfileSpec(_Spec):
    selector: LabelSelector
    sampling: SamplingSpec = Field(default_factory=SamplingSpec)
    evaluation: EvaluationSpec = Field(default_factory=EvaluationSpec)
    hardware: HardwareSpec | None = None
    thresholds: ThresholdsSpec | None = None
    sidecar: SidecarSpec = Field(default_factory=SidecarSpec)
    source: SourceSpec | None = None
    model: ModelSpec | None = None
    actions: ActionsSpec = Field(default_factory=ActionsSpec)

    @model_validator(mode="after")
    def _window_holds_samples(self) -> DAMProfileSpec:
        if self.evaluation.window_seconds < 2 * self.sampling.interval_seconds:
            raise ValueError(
                f"evaluation.windowSeconds ({self.evaluation.window_seconds:g}) must be at least twice "
                f"sampling.intervalSeconds ({self.sampling.interval_seconds:g}); "
                "lengthen the window or sample more often"
            )
        return self

    def thresholds_model(self) -> Thresholds:
        """The engine's thresholds: defaults with this spec's overrides."""
        return Thresholds() if self.thresholds is None else self.thresholds.merged()

    def hardware_model(self) -> Hardware | None:
        """The spec's hardware overrides, or None when the spec names none."""
        if self.hardware is None:
            return None
        fields = self.hardware.model_dump(exclude_none=True)
        return Hardware(**fields) if fields else None

    def prometheus_url(self) -> str | None:
        if self.source is None or self.source.prometheus is None:
            return None
        return self.source.prometheus.url


# ---------------------------------------------------------------- errors


class SpecProblem(BaseModel):
    model_config = ConfigDict(frozen=True)

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class SpecError(ValueError):
    """A DAMProfile spec that cannot be used; ``str()`` names each field and its fix."""

    def __init__(self, problems: Sequence[SpecProblem]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(str(p) for p in self.problems))

    @property
    def paths(self) -> list[str]:
        return [p.path for p in self.problems]


def _path(loc: Sequence[int | str]) -> str:
    out = "spec"
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def _field_for(loc: Sequence[int | str]) -> FieldInfo | None:
    """The FieldInfo at ``loc`` (wire names), walking nested models; None when unknown."""
    model: type[BaseModel] | None = DAMProfileSpec
    info: FieldInfo | None = None
    for part in loc:
        if isinstance(part, int):
            continue
        if model is None:
            return None
        info = next(
            (f for name, f in model.model_fields.items() if part in (name, f.alias)),
            None,
        )
        if info is None:
            return None
        model = _model_in(info.annotation)
    return info


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _bounds(info: FieldInfo) -> tuple[float | None, float | None, bool]:
    lo: float | None = None
    hi: float | None = None
    lo_open = False
    metas: list[Any] = list(info.metadata)
    for arg in getattr(info.annotation, "__args__", ()) or ():
        metas.extend(getattr(arg, "__metadata__", ()))
    for meta in metas:
        for m in getattr(meta, "metadata", [meta]):
            if getattr(m, "ge", None) is not None:
                lo = m.ge
            if getattr(m, "gt", None) is not None:
                lo, lo_open = m.gt, True
            if getattr(m, "le", None) is not None:
                hi = m.le
            if getattr(m, "lt", None) is not None:
                hi = m.lt
    return lo, hi, lo_open


def _num(x: float) -> str:
    if float(x).is_integer() and abs(x) < 1e10:
        return str(int(x))
    return f"{x:g}"


def _example(info: FieldInfo | None) -> str:
    if info is None or info.default is None or isinstance(info.default, BaseModel):
        return ""
    default = info.default
    if isinstance(default, bool | int | float | str) and not callable(default):
        return f", e.g. {_num(default)}" if isinstance(default, float) else f", e.g. {default}"
    return ""


_PATTERN_HINTS = {
    QUANTITY_PATTERN: "must be a Kubernetes quantity, e.g. 100m or 128Mi",
    IMAGE_PATTERN: "must be a container image reference, e.g. ghcr.io/mlsys/dam-operator:0.1.0",
    URL_PATTERN: "must be an http(s) URL, e.g. http://prometheus.monitoring.svc:9090",
}
"""The fix of a string that does not match its pattern, by pattern (else the pattern itself)."""
_CTX_HINTS: dict[str, tuple[str, str | None, str]] = {
    "string_too_long": ("max_length", None, "too long: at most {} characters"),
    "too_long": ("max_length", None, "too many entries: at most {}"),
    "literal_error": ("expected", "", "must be one of {}"),
}
"""The fix of an error kind that names a value of its context: (the key, its default, the sentence)."""
_FIXED_HINTS = {
    **dict.fromkeys(("string_too_short", "too_short"), "must not be empty"),
    **dict.fromkeys(("string_type", "str_type"), "must be a string"),
    **dict.fromkeys(("bool_type", "bool_parsing"), "must be true or false"),
    **dict.fromkeys(
        ("dict_type", "model_type", "model_attributes_type"), "must be an object (a mapping of fields)"
    ),
    "list_type": "must be a list",
}
"""The fix of an error kind that is the same sentence wherever it happens."""


def _hint(err: Mapping[str, Any]) -> str:
    loc: Sequence[int | str] = err.get("loc", ())
    kind: str = err.get("type", "")
    info = _field_for(loc)
    if kind == "extra_forbidden":
        parent = _field_for(loc[:-1]) if len(loc) > 1 else None
        model = DAMProfileSpec if len(loc) <= 1 else (_model_in(parent.annotation) if parent else None)
        known = sorted((f.alias or n) for n, f in model.model_fields.items()) if model else []
        listed = f"; known fields here: {', '.join(known)}" if known else ""
        return f"unknown field; remove it or check its spelling{listed}"
    if kind == "missing":
        if loc and loc[-1] == "matchLabels":
            return "required: the labels of the training pods, e.g. matchLabels: {app: trainer}"
        return "required field is missing"
    number_kinds = {
        "greater_than",
        "greater_than_equal",
        "less_than",
        "less_than_equal",
        "float_parsing",
        "float_type",
        "int_parsing",
        "int_type",
        "int_from_float",
        "finite_number",
    }
    if kind in number_kinds and info is not None:
        lo, hi, lo_open = _bounds(info)
        noun = "a whole number" if kind.startswith("int") or "int" in str(info.annotation) else "a number"
        if lo is not None and hi is not None:
            rng = f"between {_num(lo)} and {_num(hi)}"
            if lo_open:
                rng = f"above {_num(lo)} and at most {_num(hi)}"
            return f"must be {noun} {rng}{_example(info)}"
        if lo is not None:
            return f"must be {noun} {'above' if lo_open else 'at least'} {_num(lo)}{_example(info)}"
        return f"must be {noun}{_example(info)}"
    if kind == "string_pattern_mismatch":
        pattern = (err.get("ctx") or {}).get("pattern", "")
        return _PATTERN_HINTS.get(pattern, f"must match {pattern}")
    if kind in _CTX_HINTS:
        key, default, template = _CTX_HINTS[kind]
        return template.format((err.get("ctx") or {}).get(key, default))
    if kind in _FIXED_HINTS:
        return _FIXED_HINTS[kind]
    msg = str(err.get("msg", "invalid value"))
    return msg.removeprefix("Value error, ")


def _problems(exc: ValidationError) -> list[SpecProblem]:
    out: list[SpecProblem] = []
    seen: set[tuple[str, str]] = set()
    for err in exc.errors(include_url=False):
        loc = list(err.get("loc", ()))
        # Union members add their type name (e.g. "float") to loc; keep only wire names.
        cleaned = [p for p in loc if isinstance(p, int) or not (_is_type_tag(p) or p == "[key]")]
        # A dict key that failed validation ends with "[key]"; pydantic reports it in loc already.
        item = (_path(cleaned), _hint({**err, "loc": cleaned}))
        if item not in seen:
            seen.add(item)
            out.append(SpecProblem(path=item[0], message=item[1]))
    return out


def _is_type_tag(part: str) -> bool:
    return part in {"float", "int", "str", "bool", "none", "function-after", "function-before"} or (
        part.startswith(("function-", "constrained-", "lax-", "json-or-python"))
    )


def parse_spec(raw: Mapping[str, Any] | None, url_policy: UrlPolicy | None = None) -> DAMProfileSpec:
    """Validate a DAMProfile ``spec``; raise ``SpecError`` naming each bad field and its fix.

    ``url_policy``: the admin's rules on ``spec.source.prometheus.url`` (none: any URL)."""
    if raw is None:
        raise SpecError(
            [SpecProblem(path="spec", message="required: a spec with at least selector.matchLabels")]
        )
    if not isinstance(raw, Mapping):
        raise SpecError([SpecProblem(path="spec", message="must be an object (a mapping of fields)")])
    try:
        spec = DAMProfileSpec.model_validate(dict(raw), by_alias=True, context={URL_POLICY: url_policy})
    except ValidationError as exc:
        raise SpecError(_problems(exc)) from None
    return _share_parts(spec)


_MAX_SHARED_PARTS = 4096
_shared_parts: dict[_Spec, _Spec] = {}
"""One instance of each distinct spec part (``sampling``, ``evaluation``, ``sidecar``,
``actions``...). Bounded: past the limit a part is simply not shared."""


def _share_parts(spec: DAMProfileSpec) -> DAMProfileSpec:
    """``spec`` with each of its parts replaced by an equal one already parsed, if any.

    Profiles written from one template differ in their selector and little else; the parts are
    frozen, so one instance can serve them all: a parsed spec took 3.4 KB, 17 MiB at 5,000
    profiles (docs/performance.md). A part holding a dict or a list is not hashable and stays
    the profile's own.
    """
    update: dict[str, Any] = {}
    for name, value in spec.__dict__.items():
        if not isinstance(value, _Spec):
            continue
        try:
            shared = _shared_parts.get(value)
        except TypeError:
            continue
        if shared is None:
            if len(_shared_parts) < _MAX_SHARED_PARTS:
                _shared_parts[value] = value
        elif shared is not value:
            update[name] = shared
    return spec.model_copy(update=update) if update else spec


# ---------------------------------------------------------------- selectors


def selector_matches(selector: LabelSelector, labels: Mapping[str, str] | None) -> bool:
    """Kubernetes label-selector semantics: every matchLabels pair and every expression hold."""
    labels = labels or {}
    for key, value in selector.match_labels.items():
        if labels.get(key) != value:
            return False
    for req in selector.match_expressions:
        present = req.key in labels
        if req.operator == "In":
            ok = present and labels[req.key] in req.values
        elif req.operator == "NotIn":
            ok = not present or labels[req.key] not in req.values
        elif req.operator == "Exists":
            ok = present
        else:
            ok = not present
        if not ok:
            return False
    return True


def label_selector_string(selector: LabelSelector) -> str:
    """The ``labelSelector`` query parameter for list/watch calls (``app=trainer,tier in (a,b)``)."""
    parts = [f"{k}={v}" for k, v in sorted(selector.match_labels.items())]
    for req in selector.match_expressions:
        if req.operator == "In":
            parts.append(f"{req.key} in ({','.join(req.values)})")
        elif req.operator == "NotIn":
            parts.append(f"{req.key} notin ({','.join(req.values)})")
        elif req.operator == "Exists":
            parts.append(req.key)
        else:
            parts.append(f"!{req.key}")
    return ",".join(parts)
