"""A hosted per-token pool for overflow, simulated (issue 25 item 3): the shipped example
(``examples/hosted-overflow.yaml``: one MI300X replica at t=0 that may grow to four after a
two-minute cold start, and a hosted API capped at 128 requests) under a burst to twice what
that one replica carries (``examples/hosted-burst.yaml``), seed fixed, virtual time.

With the hosted pool the burst keeps at least 99% of requests within the SLO (a few shed
while the API is at its cap), the hosted API's share and spend reported apart (charged per
token, never billed as replicas); without it the same requests are shed (429) while the new
replicas boot.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetgate.config.loader import load_config
from fleetgate.sim.run import simulate
from fleetgate.sim.workload import load_workload

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
HOSTED = "hosted-8b"


def test_a_burst_overflows_to_the_hosted_pool_and_sheds_without_it() -> None:
    config = load_config(EXAMPLES / "hosted-overflow.yaml")
    workload = load_workload(EXAMPLES / "hosted-burst.yaml")
    with_hosted = simulate(config, workload, seed=1).as_json()["policies"]["cost"]
    own = config.model_copy(update={"pools": [p for p in config.pools if not p.per_token]})
    without = simulate(own, workload, seed=1).as_json()["policies"]["cost"]

    assert with_hosted["slo_attainment"] >= 0.99, with_hosted
    assert with_hosted["shed"] <= 0.001 * with_hosted["requests"]  # the API's cap, briefly
    hosted = with_hosted["pools"][HOSTED]
    assert hosted["hosted"] is True and 0.05 < hosted["share"] < 0.5
    assert with_hosted["hosted_share"] == hosted["share"]
    # charged per token at the pool's prices: no replica time, no bill for replicas
    assert hosted["usd"] > 0 and hosted["provisioned_usd"] == 0 and hosted["replicas_mean"] == 0
    assert with_hosted["hosted_usd"] == hosted["usd"]
    assert with_hosted["usd"] == pytest.approx(
        hosted["usd"] + with_hosted["pools"]["mi300x-sglang"]["usd"], rel=1e-5)
    # the hosted API is demand, never capacity: the scaler buys at least what it buys without
    # it (more: what is shed counts as demand at a decaying rate, what the API takes in full)
    assert with_hosted["provisioned_usd"] >= without["provisioned_usd"]

    assert without["shed"] > 0.05 * without["requests"], without
    assert without["slo_attainment"] < 0.9
    assert "hosted_usd" not in without
