"""The registration flow with the real vLLM, and what happens when it stops. Runs last (name
order): its final test stops the session's engine.

- A lapsed heartbeat (the worker frozen with SIGSTOP; vLLM keeps running) removes the
  endpoint from ``/admin/endpoints`` and its public name from ``/v1/models``; the next
  heartbeat (SIGCONT) brings it back.
- vLLM stopped under the worker (SIGTERM straight to the engine, as an operator or an
  orchestrator would): the gateway fails over to the emulated pool (every request still
  answers), vLLM exits cleanly, and the worker deregisters and exits 1 (its engine ended
  without being asked to). Signal forwarding by the worker itself (SIGTERM to the worker:
  deregister first, then stop the engine) is tested in ``tests/unit/test_worker.py``.
"""

from __future__ import annotations

import os
import re
import signal
from concurrent.futures import ThreadPoolExecutor

import httpx
from engines_harness import (
    EMU_POOL,
    PUBLIC,
    PUBLIC_REAL,
    REAL_POOL,
    TTL_S,
    RealEngine,
    endpoint_row,
    public_models,
    wait_for,
)

from procs import Proc

MESSAGES = [{"role": "user", "content": "Say something about GPUs."}]


def _ready(fleet: Proc, real: RealEngine) -> bool:
    row = endpoint_row(fleet.url, real.url)
    return row is not None and row["health"] == "ready"


def test_heartbeat_lapse_removes_the_worker_and_the_next_beat_restores_it(
        fleet: Proc, real: RealEngine) -> None:
    wait_for(lambda: _ready(fleet, real), 30, "the real endpoint to be ready")
    real.popen.send_signal(signal.SIGSTOP)  # no heartbeat; vLLM itself keeps running
    try:
        wait_for(lambda: endpoint_row(fleet.url, real.url) is None, TTL_S + 10,
                 "the registration to lapse")
        assert PUBLIC_REAL not in public_models(fleet.url)
        assert PUBLIC in public_models(fleet.url)  # the emulated pool still serves it
        assert httpx.get(real.url + "/health", timeout=5).status_code == 200
    finally:
        real.popen.send_signal(signal.SIGCONT)
    wait_for(lambda: _ready(fleet, real), TTL_S + 30, "the next heartbeat to re-register")
    assert PUBLIC_REAL in public_models(fleet.url)


def _chat(fleet: Proc) -> tuple[int, str]:
    resp = httpx.post(fleet.url + "/v1/chat/completions", timeout=60,
                      json={"model": PUBLIC, "messages": MESSAGES, "max_tokens": 3})
    return resp.status_code, resp.headers.get("x-fleetgate-pool", "")


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _retries(fleet: Proc) -> float:
    text = httpx.get(fleet.url + "/metrics", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("fleetgate_retries_total") and f'pool="{REAL_POOL}"' in line)


def test_engine_stopped_fails_over_and_the_worker_deregisters(fleet: Proc,
                                                              real: RealEngine) -> None:
    wait_for(lambda: _ready(fleet, real), 30, "the real endpoint to be ready")
    with ThreadPoolExecutor(4) as pool:
        assert {pool_name for _, pool_name in pool.map(lambda _: _chat(fleet), range(6))} \
            == {REAL_POOL, EMU_POOL}
        retries_before = _retries(fleet)
        os.kill(real.engine_pid, signal.SIGTERM)  # vLLM's API server: stop cleanly
        answers = list(pool.map(lambda _: _chat(fleet), range(12)))
    assert all(status == 200 for status, _ in answers), answers
    assert real.popen.wait(timeout=60) == 1, real.tail()
    lines = "\n".join(real.worker_lines())
    assert re.search(r"engine exited by itself with 0\b", lines), lines
    assert "deregistered id=" in lines
    assert endpoint_row(fleet.url, real.url) is None
    assert PUBLIC_REAL not in public_models(fleet.url) and PUBLIC in public_models(fleet.url)
    assert {_chat(fleet) for _ in range(3)} == {(200, EMU_POOL)}
    wait_for(lambda: not _group_alive(real.engine_pid), 10,
             "the engine's process group to be gone")
    print(f"\nretries away from the stopped engine: {_retries(fleet) - retries_before:.0f}; "
          f"answers: {answers}")
