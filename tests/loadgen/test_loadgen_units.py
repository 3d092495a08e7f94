"""The bench's measurement rules without a network: SSE parsing of recorded engine streams,
vLLM's TTFT / TPOT / ITL / goodput definitions, length specs, and plan --capacities."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from fleetgate.loadgen.client import Record, _Stream, base_url
from fleetgate.loadgen.metrics import is_good, summarize, tpot_s
from fleetgate.loadgen.plan import from_flags, parse_lengths
from fleetgate.loadgen.report import compare
from fleetgate.sim.candidates import PriceSheet, candidates, load_capacities
from fleetgate.sim.capacity import Mix

DATA = Path(__file__).parent.parent / "data"


def test_vllm_chat_stream_counts_chunks_like_vllm_bench() -> None:
    raw = (DATA / "vllm_chat_stream.txt").read_bytes()
    rec = Record(0)
    parser = _Stream(rec, "chat", t0=0.0)
    for i, line in enumerate(raw.split(b"\n\n")):  # one event per "read", 10 ms apart
        parser.feed(line + b"\n\n", 0.1 + 0.01 * i)
    chunks = [e for e in raw.split(b"\n\n") if b'"choices":[{' in e]
    assert rec.ttft == pytest.approx(0.1)  # the role chunk counts, as in vLLM's benchmark
    assert len(rec.itl) == len(chunks) - 1
    assert rec.output_tokens > 0 and rec.prompt_tokens > 0  # from the usage chunk
    assert rec.error_kind is None


def test_tpot_excludes_the_first_token_and_goodput_rule() -> None:
    rec = Record(0, ok=True, ttft=0.2, latency=1.2, output_tokens=11, itl=[0.1] * 10)
    assert tpot_s(rec) == pytest.approx(0.1)
    assert tpot_s(Record(1, ok=True, ttft=0.2, latency=0.2, output_tokens=1)) is None
    assert is_good(rec, (250.0, 100.0)) is True
    assert is_good(rec, (150.0, 100.0)) is False
    assert is_good(Record(2, ok=False, error_kind="http_503"), (250.0, 100.0)) is False
    one = Record(3, ok=True, ttft=0.1, latency=0.1, output_tokens=1)
    assert is_good(one, (250.0, 1.0)) is True  # a one-token answer's TPOT is 0
    failed = Record(4, ok=False, error_kind="timeout")
    row = summarize([rec, one, failed], duration_s=2.0, slo=(250.0, 100.0))
    assert row["requests"] == 2 and row["errors"] == 1
    assert row["errors_by_kind"] == {"timeout": 1}
    assert row["tpot_ms"]["mean"] == pytest.approx(100.0)  # only requests with > 1 token
    assert row["output_throughput"] == pytest.approx(6.0)
    assert row["slo_attainment"] == pytest.approx(2 / 3, abs=1e-3)


def test_length_specs_and_bounded_plans() -> None:
    assert parse_lengths("512").value == 512
    assert parse_lengths("lognormal:900:8000").max == 8000
    assert parse_lengths("uniform:10:20").min == 10
    with pytest.raises(ValueError):
        parse_lengths("gauss:1")
    with pytest.raises(ValueError, match="bounded"):
        from_flags(parse_lengths("8"), parse_lengths("8"), None, None, 1.0, 1.0, 0)
    plan = from_flags(parse_lengths("8"), parse_lengths("4"), None, 5.0, 10.0, 1.0, 0)
    assert plan.requests and all((p.arrival_s or 0) < 5.0 for p in plan.requests)
    assert base_url("http://h:1/v1/") == "http://h:1"


def test_compare_rows_change_in_percent() -> None:
    a = {"overall": {"requests": 10, "errors": 0, "ttft_ms": {"mean": 100.0}}, "pools": {}}
    b = {"overall": {"requests": 10, "errors": 0, "ttft_ms": {"mean": 110.0}}, "pools": {}}
    rows = {r["metric"]: r for r in compare(a, b)}
    assert rows["TTFT mean (ms)"]["change_pct"] == pytest.approx(10.0)


def test_plan_takes_measured_capacities_from_a_sweep(tmp_path: Path) -> None:
    sweep = {"pools": {"h100-vllm": {
        "accelerator": "h100", "engine": "vllm", "gpus_per_replica": 1, "replicas": 2,
        "capacity": {"rate_per_s": 8.0, "slo_attainment": 1.0},
        "per_replica": {"rate_per_s": 4.0, "tokens_per_s": 64.0, "concurrency": 1.0}}}}
    path = tmp_path / "sweep.json"
    path.write_bytes(orjson.dumps(sweep))
    measured = load_capacities(path)
    assert measured[("h100", "vllm", 1)].rate_per_s == 4.0
    mix = Mix((266,), (16,), 0.5, 0.05)
    rows = candidates("meta-llama/Llama-3.1-8B-Instruct", ["h100"], PriceSheet(), mix, 1,
                      measured)
    by_engine = {r.engine: r.capacity for r in rows}
    assert by_engine["vllm"].rate_per_s == 4.0  # measured, not estimated
    assert by_engine["sglang"].rate_per_s > 4.0  # still the simulator's estimate
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match="bench sweep"):
        load_capacities(bad)
