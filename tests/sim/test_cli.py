"""``simulate`` and ``plan`` as commands (registered here on a local typer app, as the
``fleetgate`` app registers them): files in, tables out, JSON and fleet files written."""

from __future__ import annotations

from pathlib import Path

import orjson
import typer
import yaml
from typer.testing import CliRunner

from fleetgate.config.loader import load_config
from fleetgate.sim.cli import plan, simulate

EXAMPLES = Path(__file__).parents[2] / "examples"
app = typer.Typer()
app.command()(simulate)
app.command()(plan)


def test_simulate_writes_json_and_a_plot(tmp_path: Path) -> None:
    out, png = tmp_path / "sim.json", tmp_path / "sim.png"
    args = ["simulate", "--config", str(EXAMPLES / "mixed-fleet.yaml"), "--workload",
            str(EXAMPLES / "chat-workload.yaml"), "--policies", "cost,round_robin",
            "--duration", "15", "--seed", "3", "--json", str(out), "--plot", str(png)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    report = orjson.loads(out.read_bytes())
    assert report["seed"] == 3 and set(report["policies"]) == {"cost", "round_robin"}
    assert "round_robin" in result.output and "lower bound" in result.output
    assert png.read_bytes().startswith(b"\x89PNG")


def test_simulate_json_is_the_same_bytes_whatever_jobs(tmp_path: Path) -> None:
    """--jobs 2 runs the policies in two processes; the JSON is the same bytes as one by one,
    stdout is the table and the progress is on stderr only."""
    outputs = []
    for jobs in ("1", "2"):
        out = tmp_path / f"sim-{jobs}.json"
        result = CliRunner().invoke(app, [
            "simulate", "--config", str(EXAMPLES / "mixed-fleet.yaml"), "--workload",
            str(EXAMPLES / "chat-workload.yaml"), "--policies", "cost,least_loaded",
            "--duration", "10", "--seed", "4", "--json", str(out), "--jobs", jobs])
        assert result.exit_code == 0, result.output
        assert "least_loaded" in result.stdout and "simulate: cost" not in result.stdout
        assert f"{jobs} jobs" in result.stderr and "simulate: cost" in result.stderr
        outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1]
    bad = CliRunner().invoke(app, ["simulate", "--config", str(EXAMPLES / "mixed-fleet.yaml"),
                                   "--workload", str(EXAMPLES / "chat-workload.yaml"),
                                   "--jobs", "0"])
    assert bad.exit_code == 1 and "--jobs" in bad.output


def test_simulate_says_what_is_wrong_with_a_file(tmp_path: Path) -> None:
    bad = tmp_path / "w.yaml"
    bad.write_text("slo: {ttft_ms: 1}\narrivals: {process: poisson, rate_per_s: 1}\n")
    result = CliRunner().invoke(app, ["simulate", "--config", str(EXAMPLES / "mixed-fleet.yaml"),
                                      "--workload", str(bad)])
    assert result.exit_code == 1
    assert "slo.tpot_ms" in result.output
    result = CliRunner().invoke(app, ["simulate", "--config", str(EXAMPLES / "mixed-fleet.yaml"),
                                      "--workload", str(EXAMPLES / "chat-workload.yaml"),
                                      "--policies", "nope"])
    assert result.exit_code == 1 and "nope" in result.output


def test_plan_writes_a_fleet_the_gateway_loads(tmp_path: Path) -> None:
    work = tmp_path / "w.yaml"
    work.write_text(yaml.safe_dump({
        "duration_s": 40, "slo": {"ttft_ms": 1500, "tpot_ms": 80},
        "arrivals": {"process": "poisson", "rate_per_s": 6},
        "requests": {"model": "llama-3.1-8b", "input_tokens": {"dist": "fixed", "value": 400},
                     "output_tokens": {"dist": "fixed", "value": 100}}}))
    prices = tmp_path / "prices.yaml"
    prices.write_text("prices: {h100: 2.2}\nengines: [vllm]\n")
    out, fleet = tmp_path / "plan.json", tmp_path / "fleet.yaml"
    result = CliRunner().invoke(app, ["plan", "--workload", str(work), "--prices", str(prices),
                                      "--gpus", "h100,mi300x", "--json", str(out),
                                      "--out", str(fleet), "--jobs", "2"])
    assert result.exit_code == 0, result.output
    assert "plan: cost on" in result.stderr and "plan: cost on" not in result.stdout
    planned = orjson.loads(out.read_bytes())
    assert planned["meets_target"] and planned["fleet"]
    assert planned["usd_per_hour"] <= planned["baselines"]["least_loaded_confirmed"]["usd_per_hour"]
    assert planned["ip_optimum_usd_per_hour"] <= planned["usd_per_hour"]
    config = load_config(fleet)  # what `fleetgate serve` and `fleetgate check` read
    assert {p.accelerator for p in config.pools} <= {"h100", "mi300x"}
    assert any(p.price_per_gpu_hour == 2.2 for p in config.pools if p.accelerator == "h100") \
        or all(p.accelerator == "mi300x" for p in config.pools)


def test_probe_requests_set_the_capacity_probe_and_are_checked(tmp_path: Path,
                                                                monkeypatch) -> None:
    """--probe-requests reaches every capacity probe of the bound (a larger probe halves the
    99% capacity's noise, BENCHMARKS.md); the default is the module's; too few is refused."""
    import inspect

    from fleetgate.sim import capacity

    default = inspect.signature(simulate).parameters["probe_requests"].default
    assert default == capacity.PROBE_REQUESTS
    assert inspect.signature(plan).parameters["probe_requests"].default == default
    sizes: list[int] = []
    drive = capacity.drive
    monkeypatch.setattr(capacity, "drive", lambda replica, arrivals, *rest: (
        sizes.append(len(arrivals)), drive(replica, arrivals, *rest))[1])
    capacity._MEMO.clear()  # a capacity memoised by another test would not be probed again
    out = tmp_path / "sim.json"
    result = CliRunner().invoke(app, [
        "simulate", "--config", str(EXAMPLES / "mixed-fleet.yaml"), "--workload",
        str(EXAMPLES / "chat-workload.yaml"), "--policies", "round_robin", "--duration", "10",
        "--json", str(out), "--probe-requests", "400", "--jobs", "1"])  # probed here
    assert result.exit_code == 0, result.output
    assert sizes and set(sizes) == {400}
    assert orjson.loads(out.read_bytes())["lower_bound"]["usd"] is not None
    for cmd in (["simulate", "--config", str(EXAMPLES / "mixed-fleet.yaml")], ["plan"]):
        bad = CliRunner().invoke(app, [*cmd, "--workload", str(EXAMPLES / "chat-workload.yaml"),
                                       "--probe-requests", "10"])
        assert bad.exit_code == 1 and "--probe-requests must be at least 200" in bad.output
