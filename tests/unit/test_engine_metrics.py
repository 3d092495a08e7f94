"""Table-driven tests of fleetgate.backends.metrics over the engine fixtures."""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleetgate.backends.metrics import (
    METRIC_NAMES,
    SIGNALS,
    EngineLoad,
    MetricNames,
    MetricsParseError,
    parse_engine_metrics,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for engine_contract
from engine_contract import assert_metrics_parse, load_fixture


def fixture_text(name: str) -> str:
    return load_fixture(name).decode()


VLLM_KV = 12943 / 30720
VLLM_KV_DP1 = 8110 / 30720

# fixture, engine, expected EngineLoad (values recorded when the fixtures were generated)
FIXTURES = [
    pytest.param(
        "vllm_metrics.txt",
        "vllm",
        EngineLoad(3.0, 12.0, VLLM_KV, 59611.0, 282332.0, None, 2.0),
        id="vllm",
    ),
    pytest.param(
        "vllm_metrics_dp2.txt",
        "vllm",
        EngineLoad(
            waiting=3.0 + 1.0,
            running=12.0 + 7.0,
            kv_usage=(VLLM_KV + VLLM_KV_DP1) / 2,
            generation_tokens_total=28045.0 + 28825.0,
            prompt_tokens_total=151820.0 + 123613.0,
            preemptions_total=1.0 + 0.0,
        ),
        id="vllm-dp2-summed-and-averaged",
    ),
    pytest.param("vllm_metrics_disabled.txt", "vllm", EngineLoad(), id="vllm-disable-log-stats"),
    pytest.param(
        "sglang_metrics.txt",
        "sglang",
        EngineLoad(3.0, 12.0, 0.4213, 13196.0 + 41481.0, 64765.0 + 189121.0, 1843.27, 2.0),
        id="sglang-is_streaming-summed",
    ),
    pytest.param(
        "sglang_loads_prometheus.txt",
        "sglang",
        EngineLoad(3.0 + 1.0, 12.0 + 7.0, (0.4213 + 0.264) / 2, None, None, 1843.27 + 1102.5),
        id="sglang_-prefix-v1-loads-dp2",
    ),
    pytest.param(
        "vllm_metrics.txt",
        "openai",
        EngineLoad(3.0, 12.0, VLLM_KV, 59611.0, 282332.0, None, 2.0),
        id="openai-engine-detects-vllm",
    ),
    pytest.param(
        "sglang_metrics.txt",
        "openai",
        EngineLoad(3.0, 12.0, 0.4213, 54677.0, 253886.0, 1843.27, 2.0),
        id="openai-engine-detects-sglang",
    ),
    pytest.param("vllm_metrics_disabled.txt", "openai", EngineLoad(), id="openai-no-engine"),
]


def assert_load_equal(got: EngineLoad, want: EngineLoad) -> None:
    for name in SIGNALS:
        g, w = getattr(got, name), getattr(want, name)
        if w is None:
            assert g is None, f"{name}: {g} (want None)"
        else:
            assert g == pytest.approx(w, rel=1e-12), f"{name}: {g} (want {w})"


@pytest.mark.parametrize(("fixture", "engine", "want"), FIXTURES)
def test_fixture_values(fixture: str, engine: str, want: EngineLoad) -> None:
    assert_load_equal(parse_engine_metrics(fixture_text(fixture), engine), want)


@pytest.mark.parametrize(
    ("fixture", "engine", "stats"),
    [
        ("vllm_metrics.txt", "vllm", True),
        ("vllm_metrics_dp2.txt", "vllm", True),
        ("vllm_metrics_disabled.txt", "vllm", False),
        ("sglang_metrics.txt", "sglang", True),
        ("sglang_loads_prometheus.txt", "sglang", True),
    ],
)
def test_contract_helper_accepts_fixtures(fixture: str, engine: str, stats: bool) -> None:
    assert_metrics_parse(fixture_text(fixture), engine, expect_stats=stats)


@pytest.mark.parametrize(
    ("engine", "fixture"), [("vllm", "vllm_metrics.txt"), ("sglang", "sglang_metrics.txt")]
)
def test_table_names_exist_in_engine_output(engine: str, fixture: str) -> None:
    """Every canonical name of the table is a sample the real engine exposes."""
    names = METRIC_NAMES[engine]
    assert isinstance(names, MetricNames)
    exposed = {
        sample.name
        for family in text_string_to_metric_families(fixture_text(fixture))
        for sample in family.samples
    }
    for signal in SIGNALS:
        canonical = getattr(names, signal)
        assert canonical is None or canonical in exposed, f"{engine}.{signal}: {canonical}"


def test_table_covers_every_engine_kind() -> None:
    assert set(METRIC_NAMES) == {"vllm", "sglang", "openai"}
    assert METRIC_NAMES["openai"] is None


def test_sglang_colon_and_underscore_prefix_agree() -> None:
    text = fixture_text("sglang_metrics.txt")
    underscored = text.replace("sglang:", "sglang_")
    assert parse_engine_metrics(underscored, "sglang") == parse_engine_metrics(text, "sglang")


def test_non_canonical_lines_take_the_prometheus_client_path_and_agree() -> None:
    """Blanks after label commas defeat the regex fast path; results must not change."""
    for fixture, engine in [("vllm_metrics_dp2.txt", "vllm"), ("sglang_metrics.txt", "sglang")]:
        text = fixture_text(fixture)
        spaced = re.sub(r'",(?=[a-z])', '", ', text)
        assert spaced != text
        assert parse_engine_metrics(spaced, engine) == parse_engine_metrics(text, engine)


V = 'vllm:{name}{{engine="{engine}",model_name="m"}} {value}'


def vllm_lines(*rows: tuple[str, str, str]) -> str:
    return "".join(V.format(name=n, engine=e, value=v) + "\n" for n, e, v in rows)


SYNTHETIC = [
    pytest.param(
        vllm_lines(("kv_cache_usage_perc", "0", "NaN"), ("num_requests_running", "0", "4")),
        {"kv_usage": None, "running": 4.0},
        id="nan-ratio-is-unknown",
    ),
    pytest.param(
        vllm_lines(("kv_cache_usage_perc", "0", "NaN"), ("kv_cache_usage_perc", "1", "0.5")),
        {"kv_usage": 0.5},
        id="nan-rank-skipped-in-average",
    ),
    pytest.param(
        vllm_lines(("num_requests_waiting", "0", "+Inf"), ("num_requests_waiting", "1", "2")),
        {"waiting": 2.0},
        id="inf-skipped",
    ),
    pytest.param(
        'vllm:num_requests_running{engine="0"} 5 1700000000000\nvllm:num_requests_waiting 7 -12\n',
        {"running": 5.0, "waiting": 7.0},
        id="timestamps",
    ),
    pytest.param(
        vllm_lines(("gpu_cache_usage_perc", "0", "0.25")),
        {"kv_usage": 0.25},
        id="old-gpu-cache-usage-name-fallback",
    ),
    pytest.param(
        vllm_lines(("gpu_cache_usage_perc", "0", "0.25"), ("kv_cache_usage_perc", "0", "0.75")),
        {"kv_usage": 0.75},
        id="new-name-wins-over-old",
    ),
    pytest.param(
        vllm_lines(("kv_cache_usage_perc", "0", "1.5")),
        {"kv_usage": 1.0},
        id="ratio-clamped",
    ),
    pytest.param(
        vllm_lines(("num_requests_running", "0", "3")),
        {"running": 3.0, "waiting": None, "generation_tokens_total": None},
        id="missing-families-are-none-not-zero",
    ),
    pytest.param(
        '  vllm:num_requests_running{engine="0"} 3\n\t# HELP x\n',
        {"running": 3.0},
        id="indented-lines",
    ),
    pytest.param(
        vllm_lines(("num_requests_running", "0", "3")).replace("\n", "\r\n"),
        {"running": 3.0},
        id="crlf",
    ),
    pytest.param(
        'vllm:num_requests_running{engine="0",model_name="a \\"q\\" \\\\ b"} 2\n',
        {"running": 2.0},
        id="escaped-label-values",
    ),
    pytest.param("", {"running": None}, id="empty-body"),
]


@pytest.mark.parametrize(("text", "want"), SYNTHETIC)
def test_synthetic_vllm(text: str, want: dict[str, float | None]) -> None:
    load = parse_engine_metrics(text, "vllm")
    for name, value in want.items():
        assert getattr(load, name) == value, name


S = (
    'sglang:{name}{{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0"'
    '{extra},tp_rank="{tp}"}} {value}\n'
)


def sglang_line(name: str, value: str, tp: str = "0", extra: str = "") -> str:
    return S.format(name=name, value=value, tp=tp, extra=extra)


SYNTHETIC_SGLANG = [
    pytest.param(
        sglang_line("num_running_reqs", "6", "0") + sglang_line("num_running_reqs", "6", "1"),
        {"running": 6.0},
        id="tp-ranks-report-one-scheduler-not-summed",
    ),
    pytest.param(
        sglang_line("num_queue_reqs", "2", extra=',dp_rank="0"')
        + sglang_line("num_queue_reqs", "5", extra=',dp_rank="1"'),
        {"waiting": 7.0},
        id="dp-ranks-summed",
    ),
    pytest.param(
        sglang_line("num_queue_reqs", "5", extra=',priority=""')
        + sglang_line("num_queue_reqs", "3", extra=',priority="0"')
        + sglang_line("num_queue_reqs", "2", extra=',priority="10"'),
        {"waiting": 5.0},
        id="priority-breakdown-ignored",
    ),
    pytest.param(
        sglang_line("token_usage", "NaN") + sglang_line("fwd_occupancy", "NaN"),
        {"kv_usage": None},
        id="nan-token-usage",
    ),
    pytest.param(
        'sglang_num_waiting_reqs{dp_rank="0"} 4\nsglang_token_usage{dp_rank="0"} 0.5\n',
        {"waiting": 4.0, "kv_usage": 0.5, "running": None},
        id="v1-loads-names",
    ),
]


@pytest.mark.parametrize(("text", "want"), SYNTHETIC_SGLANG)
def test_synthetic_sglang(text: str, want: dict[str, float | None]) -> None:
    load = parse_engine_metrics(text, "sglang")
    for name, value in want.items():
        assert getattr(load, name) == value, name


def test_sglang_fixture_nan_and_zero_gauges_do_not_leak() -> None:
    text = fixture_text("sglang_metrics.txt")
    assert re.search(r"^sglang:fwd_occupancy\{.*\} NaN$", text, re.M)
    assert re.search(r"^sglang:utilization\{.*\} 0\.0$", text, re.M)
    assert 'pid="' in text
    load = parse_engine_metrics(text, "sglang")
    assert load.kv_usage is not None and not math.isnan(load.kv_usage)


def test_removed_family_becomes_none() -> None:
    text = fixture_text("vllm_metrics.txt")
    kept = "\n".join(
        line for line in text.splitlines() if not line.startswith("vllm:generation_tokens_total")
    )
    load = parse_engine_metrics(kept, "vllm")
    assert load.generation_tokens_total is None
    assert load.running == 12.0


MALFORMED = [
    pytest.param("<!DOCTYPE html>\n<html><body>502 Bad Gateway</body></html>\n", id="html"),
    pytest.param('{"detail":"Not Found"}', id="json-404-body"),
    pytest.param('vllm:num_requests_running{engine="0" 3\n', id="unclosed-labels"),
    pytest.param('vllm:num_requests_running{engine="0"} three\n', id="bad-value"),
    pytest.param("vllm:num_requests_running{engine=0} 3\n", id="unquoted-label"),
    pytest.param(
        fixture_text("vllm_metrics.txt") + "\n<truncated by a proxy>\n", id="junk-after-text"
    ),
]


@pytest.mark.parametrize("text", MALFORMED)
def test_malformed_raises_typed_error(text: str) -> None:
    with pytest.raises(MetricsParseError):
        parse_engine_metrics(text, "vllm")


def test_parse_error_is_a_value_error() -> None:
    assert issubclass(MetricsParseError, ValueError)


def test_malformed_unread_line_is_tolerated() -> None:
    """Only the families the router reads are parsed fully (speed); a broken histogram line
    elsewhere does not hide good load signals."""
    text = fixture_text("vllm_metrics.txt") + 'vllm:request_params_n_bucket{engine="0" 1\n'
    assert parse_engine_metrics(text, "vllm").running == 12.0


def test_unknown_engine_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="unknown engine"):
        parse_engine_metrics("", "tgi")


def test_engine_load_none_means_unavailable() -> None:
    assert not EngineLoad().has_signals
    assert EngineLoad(running=0.0).has_signals


@pytest.mark.parametrize(("fixture", "engine", "want"), FIXTURES)
def test_hints_from_another_scrape_never_change_the_reading(fixture: str, engine: str,
                                                            want: EngineLoad) -> None:
    """The collector keeps where each family was per endpoint and looks there first. Read
    with hints from the same body, from a body whose families all moved (a family added in
    front: some move past the slack, some not) and from nonsense places, the load is the
    same as without."""
    text = fixture_text(fixture)
    hints: dict[bytes, int] = {}
    assert_load_equal(parse_engine_metrics(text, engine, hints), want)
    assert_load_equal(parse_engine_metrics(text, engine, hints), want)
    if want.has_signals:
        assert hints, "no family was remembered"
    for pad in (10, 600, 5000):  # a family added in front moves every other one
        filler = "".join(f"# TYPE filler_{k} gauge\nfiller_{k} 1\n" for k in range(pad // 40))
        assert_load_equal(parse_engine_metrics(filler + text, engine, dict(hints)), want)
    assert_load_equal(parse_engine_metrics(text, engine, dict.fromkeys(hints, 0)), want)
    assert_load_equal(parse_engine_metrics(text, engine, dict.fromkeys(hints, 10**9)), want)


def test_a_hint_inside_a_family_starts_over() -> None:
    """A search from the hint that lands on a family's second sample (the line before it is
    not a comment) is not taken: the family is found from the start, every series of it."""
    text = "\n".join([
        "# TYPE vllm:num_requests_running gauge",
        V.format(name="num_requests_running", engine="0", value=3),
        V.format(name="num_requests_running", engine="1", value=4),
    ]) + "\n"
    second = text.index(V.format(name="num_requests_running", engine="1", value=4)) - 1
    hints = {b"vllm:num_requests_running": second + 1024}  # its search starts at `second`
    assert parse_engine_metrics(text, "vllm", hints).running == 7.0
    assert hints[b"vllm:num_requests_running"] < second


@pytest.mark.parametrize(("line", "want"), [
    ('vllm:num_requests_running{aß="x",engine="0"} 3', 3.0),  # \w in text, not in bytes
    ('vllm:num_requests_running{engine="0",model_name="\xff\xfe"} 4', 4.0),  # not UTF-8
    ('vllm:num_requests_running{engine="0",model_name="é \\"q\\""} 5 1700000000000', 5.0),
    ('vllm:num_requests_running{engine="0"} +Inf', None),
])
def test_lines_read_on_the_bytes_read_as_on_the_text(line: str, want: float | None) -> None:
    """Sample lines are matched where they lie in the body's bytes; one that only the text
    regex takes (a non-ASCII label name) still reads, and odd bytes and escapes read as
    they did when every line was decoded first."""
    text = "# TYPE vllm:num_requests_running gauge\n" + line + "\n"
    body = text.encode("latin-1") if "\xff" in line else text.encode()
    assert parse_engine_metrics(body, "vllm").running == want
    assert parse_engine_metrics(body, "vllm", {}).running == want
