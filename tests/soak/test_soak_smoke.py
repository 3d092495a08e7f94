"""A 32-second soak (bench/soak.py) in ``make test``: a real gateway on its own Redis over
three emulated engine processes, mixed load, a fault every 4.5 s (kill, hang, 503 storm,
slow-down, Redis restart, reload). ``make soak`` runs the 10-minute one.

Asserts the ledger: 0 lost, 0 hung, 0 cut streams, no 500, every error the OpenAI envelope.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import soak


@pytest.mark.timeout(180)
@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server not on PATH")
def test_soak_smoke(tmp_path: Path) -> None:
    rc = soak.main(["--duration", "32", "--fault-every", "4.5", "--concurrency", "6",
                    "--hang-after", "30", "--out", str(tmp_path)])
    summary = json.loads((tmp_path / "summary.json").read_text())
    faults = {f["fault"] for f in summary["faults"]}
    assert {"kill", "hang", "down", "slow", "redis", "reload"} <= faults, summary["faults"]
    assert not [f for f in summary["faults"] if "inject_error" in f], summary["faults"]
    assert summary["requests"] > 100
    assert (summary["lost"], summary["hung"], summary["cut"]) == (0, 0, 0), summary["examples"]
    assert summary["unclean_errors"] == 0 and summary["status_500"] == 0, summary["examples"]
    assert summary["bad_frames"] == 0
    assert rc == 0, summary
