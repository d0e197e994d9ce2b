"""The operator's own metrics: one verdict series per profile, removed when it goes."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

from dam_contract.snapshot import parse_snapshot
from dam_operator.cluster.runtime.opmetrics import OperatorMetrics, make_metrics_app
from dam_operator.cluster.steps import metric_names as n
from dam_operator.diagnosis.model import Axis, Bottleneck, IronLaw, Regime, Verdict, WindowMetrics


def _verdict(axis: Axis, regime: Regime, mfu: float | None = None) -> Verdict:
    return Verdict(
        bottleneck=Bottleneck(axis=axis, regime=regime, lever="x", lever_detail="x", confidence=0.7),
        metrics=WindowMetrics(
            data_wait_ratio=0.4,
            steps_per_second=3.0,
            mfu=mfu,
            iron_law=IronLaw(step_seconds=0.3, data_seconds=0.2, compute_seconds=0.1),
        ),
    )


def _series(reg: CollectorRegistry, name: str) -> list[dict[str, str]]:
    out = []
    for family in reg.collect():
        for sample in family.samples:
            if sample.name == name:
                out.append(dict(sample.labels))
    return out


def test_verdict_change_replaces_the_old_series() -> None:
    reg = CollectorRegistry()
    m = OperatorMetrics(reg)
    m.observe_verdict("ns", "p", _verdict(Axis.DATA, Regime.INPUT_BOUND), 100.0)
    m.observe_verdict("ns", "p", _verdict(Axis.MACHINE, Regime.COMPUTE_BOUND), 130.0)
    series = _series(reg, n.PROFILE_VERDICT)
    assert len(series) == 1
    only = series[0]
    assert (only["namespace"], only["profile"], only["axis"], only["regime"]) == (
        "ns",
        "p",
        "Machine",
        "compute-bound",
    )
    assert only["lever"], "the verdict series carries the lever to pull"
    assert (
        reg.get_sample_value(n.PROFILE_LAST_EVALUATION_TIMESTAMP_SECONDS, {"namespace": "ns", "profile": "p"})
        == 130.0
    )


def test_missing_figures_are_removed_not_left_stale() -> None:
    reg = CollectorRegistry()
    m = OperatorMetrics(reg)
    m.observe_verdict("ns", "p", _verdict(Axis.DATA, Regime.INPUT_BOUND, mfu=0.3))
    assert reg.get_sample_value(n.PROFILE_MFU_RATIO, {"namespace": "ns", "profile": "p"}) == 0.3
    m.observe_verdict("ns", "p", _verdict(Axis.DATA, Regime.INPUT_BOUND, mfu=None))
    assert reg.get_sample_value(n.PROFILE_MFU_RATIO, {"namespace": "ns", "profile": "p"}) is None
    terms = {s["term"] for s in _series(reg, n.PROFILE_IRON_LAW_SECONDS)}
    assert terms == {"data", "compute"}  # latency unknown: no series


def test_forget_profile_removes_every_series_of_that_profile_only() -> None:
    reg = CollectorRegistry()
    m = OperatorMetrics(reg)
    for name in ("p", "q"):
        m.observe_verdict("ns", name, _verdict(Axis.DATA, Regime.INPUT_BOUND, mfu=0.1), 1.0)
        m.set_pods("ns", name, 2, 1, 1)
    m.forget_profile("ns", "p")
    for family in reg.collect():
        for sample in family.samples:
            assert sample.labels.get("profile") != "p", sample
    assert reg.get_sample_value(n.PROFILE_PODS, {"namespace": "ns", "profile": "q", "state": "matched"}) == 2
    assert m.profiles_with_series() == {("ns", "q")}


def test_counters_and_histogram() -> None:
    reg = CollectorRegistry()
    m = OperatorMetrics(reg)
    m.evaluation(ok=True)
    m.evaluation(ok=False, reason="api-5xx")
    m.scrape_duration(0.02)
    m.webhook_request("injected")
    m.set_profiles(7)
    assert reg.get_sample_value(n.OPERATOR_EVALUATIONS_TOTAL) == 2.0
    assert reg.get_sample_value(n.OPERATOR_EVALUATION_ERRORS_TOTAL, {"reason": "api-5xx"}) == 1.0
    assert reg.get_sample_value(n.OPERATOR_SCRAPE_DURATION_SECONDS + "_count") == 1.0
    assert reg.get_sample_value(n.OPERATOR_WEBHOOK_REQUESTS_TOTAL, {"result": "injected"}) == 1.0
    assert reg.get_sample_value(n.OPERATOR_PROFILES) == 7.0


def test_metrics_app_serves_parseable_text_and_health() -> None:
    async def scenario() -> tuple[int, str, int]:
        reg = CollectorRegistry()
        m = OperatorMetrics(reg)
        m.observe_verdict("ns", "p", _verdict(Axis.DATA, Regime.INPUT_BOUND))
        healthy = {"ok": False}
        runner = web.AppRunner(make_metrics_app(reg, lambda: healthy["ok"]))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            async with aiohttp.ClientSession() as s:
                async with s.get(f"http://127.0.0.1:{port}/metrics") as r:
                    text = await r.text()
                async with s.get(f"http://127.0.0.1:{port}/healthz") as r:
                    unhealthy = r.status
                healthy["ok"] = True
                async with s.get(f"http://127.0.0.1:{port}/healthz") as r:
                    return unhealthy, text, r.status
        finally:
            await runner.cleanup()

    unhealthy, text, status = asyncio.run(scenario())
    snap = parse_snapshot(text, "operator")
    assert snap.samples(n.PROFILE_VERDICT)[0].value == 1.0
    assert (unhealthy, status) == (503, 200)


def test_every_error_reason_and_webhook_result_is_exported_at_zero_from_the_start() -> None:
    reg = CollectorRegistry()
    OperatorMetrics(reg)
    for reason in n.ERROR_REASONS:
        assert reg.get_sample_value(n.OPERATOR_EVALUATION_ERRORS_TOTAL, {"reason": reason}) == 0.0, reason
    for result in n.WEBHOOK_RESULTS:
        assert reg.get_sample_value(n.OPERATOR_WEBHOOK_REQUESTS_TOTAL, {"result": result}) == 0.0, result


def test_every_reason_the_operator_can_count_is_in_the_closed_set() -> None:
    from dam_operator.cluster.adapters import sources
    from dam_operator.cluster.adapters.kube import ApiError

    scrape = {v for k, v in vars(sources).items() if k.startswith("REASON_")}
    api = {ApiError(status, "x").reason_label for status in (0, 400, 403, 404, 409, 410, 422, 429, 500, 503)}
    assert scrape | api <= set(n.ERROR_REASONS)
