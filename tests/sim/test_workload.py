"""The workload file, the arrival processes, length distributions and request-log replay."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from fleetgate.sim.arrivals import PRIORITIES, draw_lengths, generate
from fleetgate.sim.trace import read_trace
from fleetgate.sim.workload import Lengths, Workload, WorkloadError, load_workload

BASE: dict[str, Any] = {
    "slo": {"ttft_ms": 1000, "tpot_ms": 50},
    "arrivals": {"process": "poisson", "rate_per_s": 20},
    "requests": {"model": "llama-3.1-8b", "input_tokens": {"dist": "fixed", "value": 100},
                 "output_tokens": {"dist": "fixed", "value": 10}},
}


def workload(**changes: object) -> Workload:
    return Workload.model_validate(BASE | changes)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "w.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(("text", "where"), [
    ("slo: {ttft_ms: 1}\narrivals: {process: poisson, rate_per_s: 1}\n", "slo.tpot_ms"),
    ("slo: {ttft_ms: 1, tpot_ms: 1}\narrivals: {process: poisson}\n", "arrivals"),
    ("slo: {ttft_ms: 1, tpot_ms: 1}\narrivals: {process: poisson, rate_per_s: 1}\n"
     "requests: {model: m, input_tokens: {dist: lognormal}, output_tokens: {dist: fixed, "
     "value: 1}}\n", "requests.input_tokens"),
    ("slo: {ttft_ms: 1, tpot_ms: 1, typo: 2}\narrivals: {trace: x.jsonl}\n", "slo.typo"),
])
def test_errors_name_their_yaml_path(tmp_path: Path, text: str, where: str) -> None:
    with pytest.raises(WorkloadError) as err:
        load_workload(write(tmp_path, text))
    assert any(e.startswith(where) for e in err.value.errors), err.value.errors


def test_the_design_example_loads(tmp_path: Path) -> None:
    text = Path(__file__).parents[2].joinpath("examples", "chat-workload.yaml").read_text()
    w = load_workload(write(tmp_path, text))
    assert w.arrivals.rate_per_s == 40 and w.requests is not None
    assert w.requests.output_tokens.max == 2000


@pytest.mark.parametrize(("spec", "mean"), [
    ({"dist": "fixed", "value": 7}, 7.0),
    ({"dist": "uniform", "min": 10, "max": 30}, 20.0),
    ({"dist": "exponential", "mean": 250}, 250.0),
    ({"dist": "lognormal", "mean": 900, "cv": 0.5}, 900.0),
])
def test_length_distributions_have_their_mean(spec: dict[str, object], mean: float) -> None:
    values = draw_lengths(Lengths.model_validate(spec), 50_000, np.random.default_rng(0))
    assert values.min() >= 1
    assert values.mean() == pytest.approx(mean, rel=0.03)


def test_lengths_are_clipped_to_min_and_max() -> None:
    spec = Lengths(dist="exponential", mean=1000, min=5, max=1200)
    values = draw_lengths(spec, 10_000, np.random.default_rng(1))
    assert values.min() == 5 and values.max() == 1200


@pytest.mark.parametrize(("arrivals", "cv"), [
    ({"process": "poisson", "rate_per_s": 50}, 1.0),
    ({"process": "bursty", "rate_per_s": 50, "cv": 3}, 3.0),
])
def test_arrival_processes_have_their_rate_and_burstiness(arrivals: dict[str, object],
                                                          cv: float) -> None:
    reqs = generate(workload(arrivals=arrivals), seed=3, duration_s=2000)
    gaps = np.diff(reqs.arrival_s)
    assert len(reqs) / 2000 == pytest.approx(50, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.1)
    assert np.all(gaps >= 0) and reqs.arrival_s[-1] < 2000


def test_diurnal_rate_follows_the_wave() -> None:
    arrivals = {"process": "diurnal", "rate_per_s": 10, "period_s": 1000, "amplitude": 0.8}
    reqs = generate(workload(arrivals=arrivals), seed=1, duration_s=1000)
    peak = np.sum((reqs.arrival_s > 200) & (reqs.arrival_s < 300))  # sin near +1
    trough = np.sum((reqs.arrival_s > 700) & (reqs.arrival_s < 800))  # sin near -1
    assert peak > 5 * trough
    assert len(reqs) / 1000 == pytest.approx(10, rel=0.1)


def test_same_seed_same_requests_and_prefix_tenants_priorities() -> None:
    w = workload(requests=BASE["requests"] | {"prefix": {"groups": 4, "tokens": 500}},
                 tenants=[{"name": "a", "share": 3}, {"name": "b", "share": 1,
                                                     "priority": "low"}],
                 priorities={"high": 0.5, "normal": 0.5})
    one, two = generate(w, 7, 300), generate(w, 7, 300)
    assert np.array_equal(one.arrival_s, two.arrival_s)
    assert np.array_equal(one.priority, two.priority)
    assert set(one.prefix_group.tolist()) == {0, 1, 2, 3}
    assert np.all(one.prompt_tokens == 600)
    b = one.tenant == one.tenants.index("b")
    assert np.mean(b) == pytest.approx(0.25, abs=0.05)
    assert np.all(one.priority[b] == PRIORITIES.index("low"))
    assert set(one.priority[~b].tolist()) == {0, 1}
    assert not np.array_equal(one.arrival_s, generate(w, 8, 300).arrival_s)


def test_max_tokens_rules() -> None:
    reqs = generate(workload(requests=BASE["requests"] | {"max_tokens": 6}), 1, 10)
    assert np.all(reqs.max_tokens == 6) and np.all(reqs.output_tokens == 6)
    reqs = generate(workload(requests=BASE["requests"] | {"max_tokens": "none"}), 1, 10)
    assert np.all(reqs.max_tokens == 0) and np.all(reqs.output_tokens == 10)


def test_request_log_lines_replay(tmp_path: Path) -> None:
    lines = [
        {"ts": 1000.5, "event": "request", "status": 200, "e2e_ms": 500, "model": "m",
         "tenant": "t1", "stream": True, "input_tokens": 120, "output_tokens": 30},
        {"ts": 1003.0, "event": "request", "status": 200, "e2e_ms": 1000, "model": "m",
         "tenant": "t2", "stream": False, "input_tokens": 80, "output_tokens": 5},
        {"ts": 1004.0, "event": "request", "status": 429, "e2e_ms": 1, "model": "m"},
        {"ts": 1004.0, "event": "request", "status": 200, "e2e_ms": 3, "model": "emb",
         "input_tokens": 5, "output_tokens": 0},
    ]
    path = tmp_path / "log.jsonl"
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines) + b"INFO not json\n")
    read = read_trace(path, speedup=2.0)
    reqs = read.requests
    assert (read.lines, read.skipped, len(reqs)) == (5, 3, 2)
    assert reqs.arrival_s.tolist() == [0.0, 1.0]  # (1002.0 - 1000.0) / 2
    assert reqs.prompt_tokens.tolist() == [120, 80]
    assert reqs.output_tokens.tolist() == [30, 5] and reqs.max_tokens.tolist() == [30, 5]
    assert reqs.stream.tolist() == [True, False]
    assert [reqs.tenants[t] for t in reqs.tenant] == ["t1", "t2"]
