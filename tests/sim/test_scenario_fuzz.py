"""``bench/scenario_fuzz.py``: its cases are reproducible and valid, its claims are judged
as stated, and one short random case runs end to end with the lower bound under every
policy that meets the SLO (the full 40 cases: ``make scenario-fuzz``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

from fleetgate.catalog.gpus import GPUS
from fleetgate.catalog.models import MODEL_PROFILES
from fleetgate.config.schema import FleetConfig
from fleetgate.sim.workload import Workload

ROOT = Path(__file__).resolve().parents[2]


def _bench() -> Any:
    sys.path.insert(0, str(ROOT / "bench"))  # it imports bench/scenarios.py beside it
    spec = importlib.util.spec_from_file_location("scenario_fuzz",
                                                  ROOT / "bench" / "scenario_fuzz.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FUZZ = _bench()


def test_every_catalog_gpu_is_drawn() -> None:
    assert sorted(FUZZ.DRAWN) == sorted(GPUS)


def test_a_case_is_drawn_from_its_seed_and_index_alone() -> None:
    assert FUZZ.draw_case(7, 3) == FUZZ.draw_case(7, 3)
    assert FUZZ.draw_case(7, 3) != FUZZ.draw_case(7, 4)
    assert FUZZ.draw_case(7, 3) != FUZZ.draw_case(8, 3)


@pytest.mark.parametrize("index", range(40))
def test_every_case_is_a_valid_fleet_and_workload_that_fits_the_context(index: int) -> None:
    case = FUZZ.draw_case(7, index)
    config = FleetConfig.model_validate(case["config"])
    work = Workload.model_validate(case["workload"])
    assert work.requests is not None
    assert {p.name for p in config.pools} and len(config.pools) >= 2
    assert config.policies["cost"].slo.ttft_ms == work.slo.ttft_ms  # judged as it is routed
    profile = "llama-3.1-70b-fp8" if work.requests.model == "llama-3.1-70b" else "llama-3.1-8b"
    longest = work.requests.input_tokens.max + work.requests.output_tokens.max
    assert longest <= MODEL_PROFILES[profile].max_model_len  # nothing refused for its length
    assert 0.2 <= case["load"] <= 0.9


def _row(cost: tuple[float, float], ll: tuple[float, float], rr: tuple[float, float],
         bound: float) -> dict[str, Any]:
    pol = {name: {"slo": slo, "usd_per_mtok": usd}
           for name, (slo, usd) in (("cost", cost), ("least_loaded", ll), ("round_robin", rr))}
    return {"policies": pol, "bound_usd_per_mtok": bound}


def test_the_claims_are_judged_only_against_policies_within_the_slo() -> None:
    assert FUZZ.failures(_row((0.995, 1.0), (0.99, 1.5), (0.999, 2.0), 0.8)) == []
    # under 99% where least_loaded holds it; dearer than a policy that holds it
    assert FUZZ.failures(_row((0.985, 1.0), (0.99, 1.5), (0.97, 0.9), 0.8)) == [
        "SLO 98.50% where least_loaded 99.00%"]
    assert FUZZ.failures(_row((0.995, 1.0), (0.98, 0.5), (0.99, 0.9), 0.8)) == [
        "$/Mtok 1.11x round_robin's"]
    # a policy within the SLO under the lower bound: then it is no bound
    assert FUZZ.failures(_row((0.995, 1.0), (0.99, 0.7), (0.95, 0.1), 0.8)) == [
        "$/Mtok 1.43x least_loaded's", "least_loaded's $/Mtok 0.87x the lower bound at 99.00%"]


def test_the_bill_claims_of_autoscaled_cases() -> None:
    def row(cost: tuple[float, float], ll: tuple[float, float],
            bound: float) -> dict[str, Any]:
        pol = {name: {"slo": slo, "provisioned_usd": usd} for name, (slo, usd) in
               (("cost", cost), ("least_loaded", ll), ("round_robin", (0.98, 1.0)))}
        return {"policies": pol, "bound_provisioned_usd": bound}

    assert FUZZ.failures(row((0.995, 8.0), (0.99, 10.0), 7.0), bill=True) == []
    assert FUZZ.failures(row((0.985, 8.0), (0.99, 10.0), 7.0), bill=True) == [
        "SLO 98.50% where least_loaded 99.00%"]
    assert FUZZ.failures(row((0.995, 8.0), (0.992, 6.0), 7.0), bill=True) == [
        "bill 1.33x least_loaded's", "least_loaded's bill 0.86x the lower bound at 99.20%"]


def test_a_short_random_case_runs_and_no_policy_within_the_slo_beats_the_bound() -> None:
    case = FUZZ.draw_case(7, 29)  # a 70B with short answers, where the bound was undercut
    case["workload"]["duration_s"] = 90
    row = FUZZ.run_case(case, 7)
    assert "error" not in row, row
    assert set(row["policies"]) == {"cost", "least_loaded", "round_robin"}
    bound = row["bound_usd_per_mtok"]
    assert bound and bound > 0
    for name, run in row["policies"].items():
        if run["slo"] >= 0.99:
            assert run["usd_per_mtok"] >= bound, (name, run, bound)
    assert not [f for f in row["failures"] if "lower bound" in f], row["failures"]
