"""bench/scale.py's processes: the mock engine, the gateway replicas, their CPU, memory,
files and logs, and the fleet config they share."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

HERE = Path(__file__).parent
ROOT = HERE.parent
METRICS = ROOT / "tests" / "data" / "vllm_metrics.txt"
CLK_TCK = os.sysconf("SC_CLK_TCK")
POOLS = [("h100", "nvidia", 2.95), ("h200", "nvidia", 3.60), ("mi300x", "amd", 1.99),
         ("mi325x", "amd", 2.25), ("b200", "nvidia", 6.00), ("mi355x", "amd", 2.90)]
MODEL = "m"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hello " * 50}],
        "max_tokens": 16}


def cpu_s(pid: int) -> float:
    """User + system seconds of a live process (its threads included)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rfind(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK



def rss_mb(pid: int) -> float:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")



def open_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1



def raise_hard_nofile(want: int) -> tuple[int, int]:
    """Raise this process's hard open-files limit (children inherit it) where allowed."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < want:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, want))
    return resource.getrlimit(resource.RLIMIT_NOFILE)



def endpoint_urls(n: int, port: int) -> list[str]:
    """127.0.x.y for y in 1..250: 10,000 endpoints are 127.0.0.1 .. 127.0.39.250."""
    return [f"http://127.0.{i // 250}.{i % 250 + 1}:{port}" for i in range(n)]



def fleet_yaml(urls: list[str], pools: int) -> str:
    chunks = np.array_split(np.arange(len(urls)), pools)
    lines = ["pools:"]
    for k, chunk in enumerate(chunks):
        gpu, _, price = POOLS[k % len(POOLS)]
        lines.append(f"  - name: {gpu}-{k}\n    accelerator: {gpu}\n    engine: vllm\n"
                     f"    price_per_gpu_hour: {price}\n    models: {{{MODEL}: {MODEL}}}\n"
                     "    endpoints:")
        lines += [f"      - {urls[i]}" for i in chunk]
    lines.append("policies:\n  c: {strategy: cost}\ndefault_policy: c\n")
    return "\n".join(lines)



def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])



@dataclass
class Replica:
    index: int
    popen: subprocess.Popen[bytes]
    url: str
    log: Path
    replica_id: str | None = None
    ready_after_s: float = 0.0
    alive: bool = True

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def name(self) -> str:
        return f"replica {self.index}"



def start_engine(idle_s: float) -> tuple[subprocess.Popen[str], int]:
    engine = subprocess.Popen(
        [sys.executable, str(HERE / "mock_engine.py"), "--host", "0.0.0.0", "--port", "0",
         "--metrics-file", str(METRICS), "--backlog", "65535", "--idle-timeout-s", str(idle_s),
         "--stats"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert engine.stdout is not None
    line = engine.stdout.readline().strip()
    if not line.startswith("MOCK_ENGINE_READY"):
        raise RuntimeError(f"mock engine did not start: {line!r}")
    return engine, int(line.rsplit(":", 1)[1])



def engine_stats(port: int, tries: int = 20) -> Counter[str]:
    """The engine's visit counts. Near its open-files limit (10,000 addresses, and the
    replicas reconnecting after a kill) it may refuse or reset this connection: try again."""
    for attempt in range(tries):
        try:
            return Counter(httpx.get(f"http://127.0.0.1:{port}/_mock/stats", timeout=30).json())
        except httpx.TransportError:
            if attempt == tries - 1:
                raise
            time.sleep(0.5)
    raise AssertionError("unreachable")



def start_replica(index: int, config: Path, tmp: Path, env: dict[str, str],
                  timeout: float) -> Replica:
    port = free_port()
    log = tmp / f"replica-{index}.log"
    with open(log, "ab") as sink:  # the child keeps its own copy of the descriptor
        popen = subprocess.Popen(
            [sys.executable, "-m", "fleetgate.cli", "serve", "--config", str(config),
             "--port", str(port), "--workers", "1"],
            env=env, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if popen.poll() is not None:
            raise RuntimeError(f"replica {index} exited ({popen.returncode}); see {log}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/readyz", timeout=5).status_code == 200:
                return Replica(index, popen, url, log, ready_after_s=time.monotonic() - t0)
        time.sleep(0.5)
    popen.kill()
    raise RuntimeError(f"replica {index} not ready after {timeout:.0f}s; see {log}")



def ready_count(rep: Replica) -> int | None:
    with contextlib.suppress(httpx.HTTPError, ValueError):
        return int(httpx.get(rep.url + "/readyz", timeout=30).json()["endpoints_ready"])
    return None



def delete_keys(client: Any, prefix: str) -> None:
    with contextlib.suppress(Exception):
        keys = list(client.scan_iter(match=prefix + "*", count=1000))
        if keys:
            client.delete(*keys)



def log_report(replicas: list[Replica]) -> dict[str, Any]:
    out = {}
    for r in replicas:
        lines = r.log.read_text(errors="replace").splitlines()
        bad = [ln for ln in lines if re.search(r"\b(ERROR|CRITICAL|WARNING)\b|Traceback", ln)]
        down = [ln for ln in lines if re.search(r"endpoint \S+ is (not_ready|down)", ln)]
        why = Counter(m.group(1) for ln in down if (m := re.search(r"\(([^)]*)\)\s*$", ln)))
        kinds = Counter(re.sub(r"\d+(\.\d+)?", "N", ln[24:])[:120] for ln in bad)
        out[r.name] = {"lines": len(lines), "warnings_errors": len(bad),
                       "went_not_ready": len(down), "not_ready_why": dict(why.most_common(4)),
                       "kinds": dict(kinds.most_common(6))}
    return out
