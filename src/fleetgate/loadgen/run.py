"""Run a plan against a server: closed loop, open loop (Poisson / gamma / replayed arrivals).

* Closed loop (no arrival times): ``concurrency`` users, each sends its next request when its
  last one ends, until the plan is exhausted or ``duration_s`` has passed (no new request
  starts after it).
* Open loop: each request is sent at its arrival time, whether or not earlier ones are done;
  ``concurrency``, if given, caps the requests in flight (a request waits for a free slot,
  and its clock starts when it is sent, as with ``vllm bench serve --max-concurrency``).

Before the measured run, ``warmup`` requests are sent one at a time and not counted (vLLM's
benchmark sends one); if every one fails the run stops there with the server's answer. The
run's duration is from the first send to the last completion, as vLLM's benchmark measures
it; every throughput is divided by it.

May touch: asyncio, aiohttp, the client. Must not touch: printing (``on_record`` is told each
finished request; the command draws the progress bar).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from fleetgate.loadgen.client import Api, Planned, Record, request_body, send
from fleetgate.loadgen.plan import Plan
from fleetgate.loadgen.prompts import PromptMaker


@dataclass(frozen=True)
class Target:
    url: str  # the server root
    model: str
    api: Api = "chat"
    stream: bool = True
    ignore_eos: bool = False
    headers: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 600.0


@dataclass
class RunResult:
    records: list[Record]
    duration_s: float
    started_at: float  # wall clock (time.time) at the first send


class WarmupFailed(RuntimeError):
    pass


async def run_plan(plan: Plan, target: Target, prompts: PromptMaker,
                   concurrency: int | None = None, warmup: int = 1,
                   on_record: Callable[[Record], None] | None = None) -> RunResult:
    limit = concurrency or 0
    connector = aiohttp.TCPConnector(limit=limit, limit_per_host=limit, keepalive_timeout=60)
    timeout = aiohttp.ClientTimeout(total=target.timeout_s)
    headers = {"content-type": "application/json", **target.headers}
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        sender = _Sender(session, target, prompts, headers)
        await sender.warmup(plan, warmup)
        records: list[Record] = []

        def done(rec: Record) -> None:
            records.append(rec)
            if on_record is not None:
                on_record(rec)

        sender.clock0 = time.perf_counter()
        started = time.time()
        if plan.closed:
            await _closed(plan, sender, concurrency or 1, done)
        else:
            await _open(plan, sender, concurrency, done)
        last = max((r.start + r.latency for r in records), default=0.0)
    records.sort(key=lambda r: r.index)
    return RunResult(records, max(last, 1e-9), started)


class _Sender:
    def __init__(self, session: aiohttp.ClientSession, target: Target, prompts: PromptMaker,
                 headers: dict[str, str]) -> None:
        self.session, self.target, self.prompts, self.headers = session, target, prompts, headers
        self.clock0 = time.perf_counter()

    async def send(self, p: Planned) -> Record:
        t = self.target
        body = request_body(t.api, p.model or t.model, self.prompts.make(p.prompt_tokens, p.index),
                            p.output_tokens, t.stream, t.ignore_eos)
        rec = Record(p.index, prompt_tokens=p.prompt_tokens)
        return await send(self.session, t.url, t.api, body, rec, self.clock0, self.headers)

    async def warmup(self, plan: Plan, n: int) -> None:
        if n <= 0:
            return
        first = next(plan.iterate())
        probe = Planned(-1, min(first.prompt_tokens, 64), min(first.output_tokens, 4),
                        model=first.model)
        last: Record | None = None
        for _ in range(n):
            last = await self.send(probe)
            if last.ok:
                return
        assert last is not None
        raise WarmupFailed(f"the warm-up request failed ({last.error_kind}): {last.error}")


async def _closed(plan: Plan, sender: _Sender, users: int,
                  done: Callable[[Record], None]) -> None:
    source = plan.iterate()
    deadline = None if plan.duration_s is None else sender.clock0 + plan.duration_s

    async def user() -> None:
        while deadline is None or time.perf_counter() < deadline:
            p = next(source, None)
            if p is None:
                return
            done(await sender.send(p))

    await asyncio.gather(*(user() for _ in range(users)))


async def _open(plan: Plan, sender: _Sender, cap: int | None,
                done: Callable[[Record], None]) -> None:
    gate = asyncio.Semaphore(cap) if cap else None
    tasks: set[asyncio.Task[None]] = set()

    async def one(p: Planned) -> None:
        if gate is None:
            done(await sender.send(p))
            return
        async with gate:
            done(await sender.send(p))

    for p in plan.iterate():
        wait = sender.clock0 + (p.arrival_s or 0.0) - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)
        task = asyncio.create_task(one(p))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    while tasks:
        await asyncio.gather(*list(tasks))
