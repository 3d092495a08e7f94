"""``fleetgate bench`` and ``bench sweep`` against a real gateway over real emulated engines
(real HTTP on local ports): the DESIGN.md §1 JSON, the per-pool split from x-fleetgate-pool,
$/Mtok from the gateway's ledger, plots, --compare, and a sweep of one pool set against the
simulator's capacity for it. Small, bounded runs; no timing asserts beyond a coarse bracket.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from fleetgate.cli import app
from fleetgate.emulator.config import EmulatorConfig
from fleetgate.sim.capacity import Mix, replica_capacity
from procs import PUBLIC_8B, SERVED_8B, Proc, pool, spawn_gateway

STATS = {"mean", "p50", "p90", "p99"}
GROUP_KEYS = {"requests", "errors", "ttft_ms", "tpot_ms", "itl_ms", "e2e_ms",
              "request_throughput", "output_throughput"}


@pytest.fixture(scope="module")
def two_pools(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    config = {"pools": [
        pool("h100-vllm", "h100", "vllm", 2.95, ["emulated://vllm/h100?speed=4"],
             {PUBLIC_8B: SERVED_8B}),
        pool("mi300x-sglang", "mi300x", "sglang", 1.99, ["emulated://sglang/mi300x?speed=4"],
             {PUBLIC_8B: SERVED_8B})],
        "policies": {"rr": {"strategy": "round_robin"}}, "default_policy": "rr"}
    proc = spawn_gateway(config, tmp_path_factory.mktemp("bench"))
    yield proc
    proc.stop()


def _bench(args: list[str]) -> None:
    result = CliRunner().invoke(app, ["bench", *args])
    assert result.exit_code == 0, result.output


def test_bench_json_pools_costs_plots_and_compare(two_pools: Proc, tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    _bench(["--url", two_pools.url + "/v1", "--concurrency", "4", "--requests", "24",
            "--input-tokens", "128", "--output-tokens", "16", "--slo-ttft-ms", "2000",
            "--slo-tpot-ms", "200", "--json", str(a), "--plot", str(tmp_path / "plots"),
            "--quiet"])
    _bench(["--url", two_pools.url, "--rate", "20", "--requests", "16", "--api", "completions",
            "--input-tokens", "uniform:64:256", "--output-tokens", "8", "--json", str(b),
            "--quiet"])
    res = orjson.loads(a.read_bytes())
    assert set(res["overall"]) >= GROUP_KEYS
    assert res["overall"]["requests"] == 24 and res["overall"]["errors"] == 0
    assert set(res["pools"]) == {"h100-vllm", "mi300x-sglang"}
    for group in [res["overall"], *res["pools"].values()]:
        assert set(group) >= GROUP_KEYS
        for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
            assert set(group[key]) == STATS and group[key]["mean"] > 0
        assert group["usd_per_mtok"] > 0  # from the gateway's /admin/costs
        assert group["slo_attainment"] == 1.0
    assert sum(p["requests"] for p in res["pools"].values()) == 24
    assert res["run"]["mode"] == "closed" and "prompt_lengths" in res["run"]
    assert (tmp_path / "plots" / "latency_cdf.png").stat().st_size > 10_000
    assert (tmp_path / "plots" / "pools.png").stat().st_size > 10_000

    cmp = tmp_path / "cmp.json"
    _bench(["--compare", str(a), str(b), "--json", str(cmp), "--plot", str(tmp_path / "c")])
    rows = orjson.loads(cmp.read_bytes())["rows"]
    groups = {r["group"] for r in rows}
    assert {"overall", "h100-vllm", "mi300x-sglang"} <= groups
    assert any(r["metric"] == "TTFT mean (ms)" and r["change_pct"] is not None for r in rows)
    assert (tmp_path / "c" / "compare_cdf.png").exists()


def test_sweep_brackets_the_simulators_capacity(tmp_path: Path) -> None:
    """One pool (H100 vLLM emulated at 2x), prefill-bound requests, TTFT-bound SLO: the
    sweep passes at 0.7x the simulator's capacity and fails at 1.5x (BENCHMARKS.md has the
    full search, within 10%)."""
    config = {"pools": [pool("h100-vllm", "h100", "vllm", 2.95, ["emulated://vllm/h100?speed=2"],
                             {PUBLIC_8B: SERVED_8B})]}
    gw = spawn_gateway(config, tmp_path)
    try:
        engine = EmulatorConfig(engine="vllm", gpu="h100", served_models=[SERVED_8B])
        # 2000 words + the chat template's 10 tokens, as the emulator counts them
        sim = replica_capacity(engine, Mix((2010,), (16,), 0.3, 0.05), 1, speed=2.0).rate_per_s
        loads = f"{0.7 * sim:.2f},{1.5 * sim:.2f}"
        out = tmp_path / "sweep.json"
        _bench(["sweep", "--url", gw.url, "--loads", loads, "--duration", "4",
                "--input-tokens", "2000", "--output-tokens", "16", "--slo-ttft-ms", "300",
                "--slo-tpot-ms", "50", "--json", str(out), "--plot", str(tmp_path)])
    finally:
        gw.stop()
    res = orjson.loads(out.read_bytes())
    p = res["pools"]["h100-vllm"]
    assert p["accelerator"] == "h100" and p["engine"] == "vllm" and p["replicas"] == 1
    assert [s["passed"] for s in p["steps"]] == [True, False]
    assert p["capacity"]["load"] == pytest.approx(0.7 * sim, rel=0.01)
    assert p["per_replica"]["rate_per_s"] > 0
    assert (tmp_path / "sweep.png").exists()
