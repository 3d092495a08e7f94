"""``fleetgate serve --workers 2``: one port, one fleet, one set of limits, one /metrics.

A real supervisor with two real worker processes and the emulated engine it runs once. The
workers share the supervisor's socket, so which one answers a connection is the kernel's
choice: every check here opens fresh connections and holds whichever worker answers.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from procs import PUBLIC_8B, SERVED_8B, Proc, pool, spawn_gateway, wait_for

KEY = "sk-team-a-0123456789abcdef"
ADMIN = "sk-admin-0123456789abcdef0"
RPM = 12
ADMIN_HEADERS = {"authorization": f"Bearer {ADMIN}"}


def _children(pid: int) -> dict[int, str]:
    """pid -> command line of each live child of ``pid``."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            found[int(entry.name)] = cmdline
    return found


def _workers(sup: Proc) -> list[int]:
    return sorted(p for p, cmd in _children(sup.popen.pid).items() if "fleetgate serve" in cmd)


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[Proc]:
    config = {
        "pools": [pool("h100-vllm", "h100", "vllm", 2.95, ["emulated://vllm/h100?speed=50"],
                       {PUBLIC_8B: SERVED_8B})],
        "policies": {"cheapest": {"strategy": "cost"}}, "default_policy": "cheapest",
        "auth": {"admin_keys": [ADMIN], "keys": [
            {"name": "team-a", "key": KEY, "tenant": "team-a", "limits": {"rpm": RPM}}]},
    }
    proc = spawn_gateway(config, tmp_path, workers=2,
                         env={"FLEETGATE_SYNC_INTERVAL_S": "0.2", "FLEETGATE_REQUEST_LOG": "off"})
    replicas: set[str] = set()

    def both_listen() -> bool:  # a worker listens once its start-up is done
        replicas.add(httpx.get(proc.url + "/admin/endpoints", headers=ADMIN_HEADERS,
                               timeout=10).json()["replica"])
        return len(replicas) == 2

    wait_for(both_listen, 60, "both workers to answer")
    yield proc
    proc.stop()


def _chat(url: str) -> int:
    resp = httpx.post(url + "/v1/chat/completions", timeout=30,  # a fresh connection each
                      headers={"authorization": f"Bearer {KEY}"},
                      json={"model": PUBLIC_8B, "max_tokens": 2,
                            "messages": [{"role": "user", "content": "hello"}]})
    return resp.status_code


def _metric(url: str, name: str, **labels: str) -> float:
    text = httpx.get(url + "/metrics", headers=ADMIN_HEADERS, timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_two_workers_share_the_limits_the_metrics_the_costs_and_the_engine(
        gateway: Proc) -> None:
    children = _children(gateway.popen.pid)
    assert sum("fleetgate.emulator" in cmd for cmd in children.values()) == 1  # run once
    assert len(_workers(gateway)) == 2

    with ThreadPoolExecutor(2 * RPM) as pool_:
        codes = list(pool_.map(lambda _: _chat(gateway.url), range(2 * RPM)))
    assert sorted(codes) == [200] * RPM + [429] * RPM  # exact across the two workers

    by_replica: dict[str, int] = {}

    def both_answered() -> bool:  # each worker's decision log names it
        log = httpx.get(gateway.url + "/admin/decisions?limit=1000", headers=ADMIN_HEADERS,
                        timeout=10).json()["decisions"]
        if log:
            by_replica[log[0]["replica"]] = len(log)
        return len(by_replica) == 2

    wait_for(both_answered, 20, "both workers' decision logs")
    assert sum(by_replica.values()) == RPM and min(by_replica.values()) > 0

    def served() -> float:
        return _metric(gateway.url, "fleetgate_requests_total", status="200")

    wait_for(lambda: served() == RPM, 10, "the last request's metrics")  # after its answer
    for _ in range(4):  # one /metrics: whichever worker answers, every worker's requests
        assert served() == RPM

    def costs_of_both() -> dict | None:
        report = httpx.get(gateway.url + "/admin/costs", headers=ADMIN_HEADERS,
                           timeout=10).json()
        replicas = {r["replica"]: r for r in report["replicas"]}
        return report if set(replicas) == set(by_replica) else None

    report = wait_for(costs_of_both, 20, "/admin/costs to cover both workers")
    assert sum(r["requests"] for r in report["replicas"]) == RPM
    assert report["total"]["requests"] == RPM


def test_a_dead_worker_is_replaced_and_sigterm_stops_everything(gateway: Proc) -> None:
    first = _workers(gateway)
    os.kill(first[0], signal.SIGKILL)
    wait_for(lambda: (w := _workers(gateway)) and len(w) == 2 and first[0] not in w, 30,
             "the supervisor to start a new worker")
    assert all(_chat(gateway.url) == 200 for _ in range(4))
    everyone = set(_children(gateway.popen.pid))
    gateway.popen.send_signal(signal.SIGTERM)
    assert gateway.popen.wait(timeout=60) == 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in everyone):
        time.sleep(0.05)
    assert not [p for p in everyone if Path(f"/proc/{p}/stat").exists()
                and " Z " not in Path(f"/proc/{p}/stat").read_text()]
