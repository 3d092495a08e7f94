"""Overhead of the state stores: µs per limit call and per shared-state round trip.

Times, in one process on one event loop, sequential awaits (so latency, not throughput):
``take`` (a rate-limit check-and-add), ``acquire`` + ``release``, ``add_spend``, and the
shared-state sync of one replica (``publish`` of its shares, ``peers`` reading 3 other
replicas) with 10 and 100 endpoints, for the in-memory store and the Redis store (also
behind ``FailoverLimitStore``); then ``take`` throughput with 64 concurrent callers. Prints
a markdown table (median of 5 runs, each the mean over N calls) for BENCHMARKS.md.

Redis: ``--redis-url``, else ``$FLEETGATE_REDIS_URL``, else redis://127.0.0.1:6379/15 if it
answers, else a ``redis-server`` started here on a free port. Keys use a unique prefix and
expire on their own.

Run: .venv/bin/python bench/store_overhead.py [--redis-url URL] [-n 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import socket
import statistics
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable

import redis

from fleetgate.state.store import (
    EndpointShare,
    FailoverLimitStore,
    MemoryLimits,
    SharedState,
)
from fleetgate.state.store.memory import MemorySharedState
from fleetgate.state.store.redis import RedisLimits, RedisSharedState

NOW = 1_790_000_000.0
Op = Callable[[int], Awaitable[object]]


def redis_url(arg: str | None) -> tuple[str, subprocess.Popen[bytes] | None]:
    url = arg or os.environ.get("FLEETGATE_REDIS_URL") or "redis://127.0.0.1:6379/15"
    try:
        redis.Redis.from_url(url, socket_timeout=0.5).ping()
        return url, None
    except (redis.RedisError, OSError):
        if arg or os.environ.get("FLEETGATE_REDIS_URL"):
            raise
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    binary = shutil.which("redis-server") or "redis-server"
    proc = subprocess.Popen([binary, "--port", str(port), "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    for _ in range(200):
        try:
            redis.Redis.from_url(url).ping()
            return url, proc
        except (redis.RedisError, OSError):
            time.sleep(0.02)
    raise RuntimeError("could not start redis-server")


async def per_call_us(op: Op, n: int, runs: int = 5) -> float:
    for i in range(min(n, 200)):  # warm up: connections, scripts
        await op(i)
    results = []
    for r in range(runs):
        start = time.perf_counter()
        for i in range(n):
            await op(r * n + i)
        results.append((time.perf_counter() - start) / n * 1e6)
    return statistics.median(results)


async def concurrent_per_s(op: Op, n: int, concurrency: int = 64) -> float:
    counter = iter(range(10**9))

    async def worker() -> None:
        for _ in range(n // concurrency):
            await op(next(counter))

    start = time.perf_counter()
    await asyncio.gather(*[worker() for _ in range(concurrency)])
    return (n // concurrency) * concurrency / (time.perf_counter() - start)


def shares(n: int) -> dict[str, EndpointShare]:
    return {f"pool-{i % 6}/http://10.0.{i // 250}.{i % 250}:8000":
            EndpointShare(float(i % 7), 0.12, 0.011, 1800.0, 1.05, 0.97, 0.0, "ready")
            for i in range(n)}


async def limit_rows(url: str, n: int) -> list[tuple[str, float, float, float]]:
    prefix = f"bench:{uuid.uuid4().hex[:8]}:"
    mem, red = MemoryLimits(), RedisLimits.from_url(url, prefix)
    fail = FailoverLimitStore(RedisLimits.from_url(url, prefix + "f:"), MemoryLimits())
    rows = []
    for name, make in [
        ("take (rpm check-and-add)",
         lambda s: lambda i: s.take("team-a", 1, 1e12, 60, NOW + i * 1e-4)),
        ("acquire + release", lambda s: lambda i: _acquire_release(s, i)),
        ("add_spend", lambda s: lambda i: s.add_spend("team-a", 0.001, "2026-11", 3600)),
    ]:
        rows.append((name, await per_call_us(make(mem), n), await per_call_us(make(red), n),
                     await per_call_us(make(fail), n)))
    ping = await per_call_us(lambda _i: red.client.ping(), n)
    rows.insert(0, ("PING (redis-py round-trip floor)", float("nan"), ping, float("nan")))
    for s in (mem, red, fail):
        await s.close()
    return rows


async def _acquire_release(store: MemoryLimits | RedisLimits | FailoverLimitStore,
                           i: int) -> None:
    hold = await store.acquire("team-a", 10**6, 30, NOW + i * 1e-4)
    if hold is not None:
        await store.release("team-a", hold)


def _publish(store: SharedState, data: dict[str, EndpointShare]) -> Op:
    return lambda _i: store.publish("me", data, 30)


def _peers(store: SharedState) -> Op:
    return lambda _i: store.peers("me")


async def shared_rows(url: str, n: int) -> list[tuple[str, float, float, float]]:
    rows = []
    for endpoints in (10, 100):
        prefix = f"bench:{uuid.uuid4().hex[:8]}:"
        mem, red = MemorySharedState(), RedisSharedState.from_url(url, prefix)
        data = shares(endpoints)
        for store in (mem, red):
            for peer in ("r1", "r2", "r3"):
                await store.publish(peer, data, 30)
        pub = [await per_call_us(_publish(s, data), n // 4) for s in (mem, red)]
        peers = [await per_call_us(_peers(s), n // 4) for s in (mem, red)]
        rows.append((f"publish, {endpoints} endpoints", pub[0], pub[1], float("nan")))
        rows.append((f"peers (3 replicas x {endpoints} endpoints)", peers[0], peers[1],
                     float("nan")))
        await red.close()
    return rows


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--redis-url")
    parser.add_argument("-n", type=int, default=1000)
    args = parser.parse_args()
    url, proc = redis_url(args.redis_url)
    try:
        info = redis.Redis.from_url(url).info("server")
        rows = await limit_rows(url, args.n) + await shared_rows(url, args.n)
        red = RedisLimits.from_url(url, f"bench:{uuid.uuid4().hex[:8]}:")
        tput = await concurrent_per_s(
            lambda i: red.take("team-a", 1, 1e12, 60, NOW + i * 1e-4), args.n * 2)
        await red.close()
    finally:
        if proc is not None:
            proc.kill()
    print(f"Machine: {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, "
          f"Python {platform.python_version()}, redis-py {redis.__version__}, "
          f"Redis {info['redis_version']} on {url.split('@')[-1]}\n")
    print("| operation | memory µs | Redis µs | Redis + failover µs |")
    print("|---|---|---|---|")
    for name, m, r, f in rows:
        mem = "-" if m != m else f"{m:.1f}"
        print(f"| {name} | {mem} | {r:.0f} | {'-' if f != f else f'{f:.0f}'} |")
    print(f"\nRedis `take` throughput, 64 concurrent callers, one client: {tput:,.0f}/s")


if __name__ == "__main__":
    asyncio.run(main())
