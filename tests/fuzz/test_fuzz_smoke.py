"""The bounded fuzz runs of ``make test``: 1,000 schemathesis cases and 1,000 type-wrong cases
(typewrong.py) against two real gateways (open and auth on) over real emulated engines;
``make fuzz`` runs 10,000 of each (fuzz_harness.py).

Asserts what issue 15 asks of the fuzz: no 500, no dropped connection, no 502/503/504 unless
the engine itself fails the same request, every error the OpenAI envelope, every chat /
completions event stream ended by ``[DONE]``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fuzz_harness import TYPEWRONG_MODELS, Fuzzer, fuzz_fleet, typewrong_targets
from typewrong import run_typewrong

CASES = 1_000


@pytest.mark.timeout(300)
def test_schemathesis_smoke_1000_cases(tmp_path: Path) -> None:
    with fuzz_fleet(tmp_path) as (gateways, engines):
        tally = Fuzzer(gateways, engines, seed_=0).run(CASES)
    report = tally.report()
    assert tally.cases >= CASES, report
    assert tally.clean, json.dumps({k: report[k] for k in ("findings", "examples")}, indent=1)
    assert "500" not in report["by_status"]
    assert set(report["by_gateway"]) == {"open", "auth"}


TYPEWRONG_CASES = 1_000


@pytest.mark.timeout(300)
def test_typewrong_smoke_1000_cases(tmp_path: Path) -> None:
    """Issue 24 item 1: every OpenAI field with wrong-typed values; no 500, no 502 that the
    request caused, every error the envelope, no dropped connection."""
    with fuzz_fleet(tmp_path) as (gateways, _):
        tally = run_typewrong(typewrong_targets(gateways), TYPEWRONG_MODELS, TYPEWRONG_CASES)
    report = tally.report()
    assert tally.cases == TYPEWRONG_CASES
    assert tally.clean, json.dumps(report, indent=1)
    assert report["by_status"].get("400", 0) > TYPEWRONG_CASES // 2  # the cases reach a check
