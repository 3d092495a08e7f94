"""Prefix-cache-aware routing, live: TTFT p50 and $/Mtok with and without the scorer.

Starts ``fleetgate serve`` (a child process) on a fleet of emulated engines (each its own
process, started by the gateway), sends a prefix-heavy chat workload over real HTTP at a
fixed Poisson rate, and reads TTFT from the client side (first content frame) and $/Mtok
from ``/admin/costs``. Then does it again on a fresh gateway and fresh engines (empty caches)
with the other policy. Same seed, same requests, same arrival times for both.

Workload: ``--groups`` conversations, each with a shared prefix of ``--prefix-tokens``
tokens (4 characters a token) plus a short new turn; every request picks a conversation at
random. The default fleet is four emulated H100 vLLM replicas at the same price (KV cache
~420k tokens each; 400 x 3,000 = 1.2M tokens of prefixes fit the fleet, not one replica).

Run: .venv/bin/python bench/prefix_live.py [--requests 1500] [--rate 15] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

MODEL = "llama-3.1-8b"
SLO = {"ttft_ms": 1500, "tpot_ms": 80}
POLICIES = {
    "cost": {"strategy": "cost", "slo": SLO},
    "cost_prefix": {"strategy": "cost", "slo": SLO,
                    "scorers": [{"name": "cost", "weight": 3},
                                {"name": "prefix_cache", "weight": 1}]},
    "least_loaded": {"strategy": "least_loaded"},
    "least_loaded_prefix": {"strategy": "least_loaded",
                            "scorers": [{"name": "queue", "weight": 1},
                                        {"name": "kv_headroom", "weight": 0.25},
                                        {"name": "prefix_cache", "weight": 1.25}]},
}


def fleet(replicas: int, policy: str) -> dict:
    return {
        "pools": [{"name": "h100-vllm", "accelerator": "h100", "engine": "vllm",
                   "price_per_gpu_hour": 2.95,
                   "endpoints": [f"emulated://vllm/h100#{k}" for k in range(replicas)],
                   "models": {MODEL: "meta-llama/Llama-3.1-8B-Instruct"}}],
        "policies": POLICIES, "default_policy": policy,
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def workload(args: argparse.Namespace) -> list[tuple[float, list[dict]]]:
    rng = random.Random(args.seed)
    prefixes = [f"conversation {g}: " + " ".join(
        f"w{rng.randrange(10**6)}" for _ in range(args.prefix_tokens * 4 // 8))
        for g in range(args.groups)]
    t, out = 0.0, []
    for k in range(args.requests):
        t += rng.expovariate(args.rate)
        g = rng.randrange(args.groups)
        turn = f"turn {k}: " + "x" * int(rng.expovariate(1 / 800))
        out.append((t, [{"role": "system", "content": prefixes[g]},
                        {"role": "user", "content": turn}]))
    return out


async def one(client: httpx.AsyncClient, at: float, start: float, messages: list[dict],
              max_tokens: int, ttfts: list[float], errors: list[str]) -> None:
    await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
    t0 = time.perf_counter()
    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "stream": True}
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
            first = None
            async for line in resp.aiter_lines():
                if first is None and line.startswith("data: ") and '"content":"' in line:
                    first = time.perf_counter()
            if resp.status_code != 200 or first is None:
                errors.append(str(resp.status_code))
                return
            ttfts.append(first - t0)
    except httpx.HTTPError as exc:
        errors.append(type(exc).__name__)


async def drive(url: str, requests: list[tuple[float, list[dict]]],
                max_tokens: int) -> tuple[list[float], list[str]]:
    ttfts: list[float] = []
    errors: list[str] = []
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=512)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        start = time.perf_counter() + 0.5
        await asyncio.gather(*(one(client, at, start, msgs, max_tokens, ttfts, errors)
                               for at, msgs in requests))
    return ttfts, errors


def run_policy(policy: str, args: argparse.Namespace,
               requests: list[tuple[float, list[dict]]]) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "fleet.yaml"
        config.write_text(yaml.safe_dump(fleet(args.replicas, policy)))
        env = os.environ | {"FLEETGATE_CONFIG": str(config), "FLEETGATE_PORT": str(port)}
        proc = subprocess.Popen([sys.executable, "-m", "fleetgate.cli", "serve"], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.time() + 120
            while time.time() < deadline:
                try:
                    if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
            else:
                raise RuntimeError("the gateway did not become ready")
            ttfts, errors = asyncio.run(drive(url, requests, args.max_tokens))
            costs = httpx.get(url + "/admin/costs", timeout=10).json()
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    ttfts.sort()
    total = costs.get("total") or {}
    return {"requests": len(requests), "ok": len(ttfts), "errors": len(errors),
            "ttft_ms": {"p50": statistics.median(ttfts) * 1000,
                        "p90": ttfts[int(len(ttfts) * 0.9)] * 1000},
            "usd": total.get("usd"), "usd_per_mtok": total.get("usd_per_mtok")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--rate", type=float, default=15.0)
    parser.add_argument("--groups", type=int, default=400)
    parser.add_argument("--prefix-tokens", type=int, default=3000)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--base", choices=["cost", "least_loaded"], default="cost",
                        help="the policy compared with itself plus the prefix_cache scorer")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    requests = workload(args)
    names = (args.base, args.base + "_prefix")
    report: dict = {name: run_policy(name, args, requests) for name in names}
    base, pref = report[names[0]], report[names[1]]
    report["ttft_p50_change"] = pref["ttft_ms"]["p50"] / base["ttft_ms"]["p50"] - 1
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
