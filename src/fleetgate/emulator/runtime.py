"""The engine loop: runs ``EngineSim`` in real time and hands tokens to waiting requests.

``EngineRuntime`` owns one asyncio task. Each iteration asks the simulator how long its next
step takes, sleeps ``duration * slow_factor / speed`` (against a running deadline, so the
rate stays right even when the event loop is late by a little; a change of the slow factor
re-times the step in progress), runs the step and puts each
new token on its request's ``asyncio.Queue``. ``speed`` X runs the emulated clock X times
faster than the wall clock; every latency the emulator reports (metrics, ``/emulator/state``)
is wall-clock time, i.e. what a client of this server measures.

Requests leave the simulator the moment they are aborted (``abort``): the server calls it
when the HTTP client disconnects, so ``num_requests_running`` falls at once (vLLM behaviour;
real SGLang waits ~2 s after a stream closes, engines.md §2.7, the emulator does not).

May touch: asyncio, the perf model, the metrics object. Must not touch: HTTP, wire formats
(except ``token_text`` for the generated filler; a request with an output plan brings its own
text). An embedding request (``pooling``) is one prefill and one step that counts no output
token in the metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fleetgate.emulator.formats import token_text
from fleetgate.emulator.metrics import EngineGauges, EngineMetrics, FinishedRequest
from fleetgate.emulator.parsing import ParsedRequest
from fleetgate.emulator.perfmodel import EngineSim, TokenEvent

THROUGHPUT_WINDOW_S = 5.0
MAX_LAG_S = 0.05  # a loop this late restarts its schedule instead of catching up


@dataclass(frozen=True, slots=True)
class Output:
    """One token (or the abort notice) delivered to a request."""

    text: str
    completion_tokens: int  # tokens generated so far, this one included
    finish_reason: str | None  # set on the last output: "length" | "stop" | "abort"


class RequestHandle:
    """A request inside the engine, as the HTTP side sees it."""

    __slots__ = (
        "arrival",
        "cached",
        "done",
        "first_at",
        "generated",
        "key",
        "last_at",
        "queue",
        "record",
        "req",
    )

    def __init__(self, key: str, req: ParsedRequest, arrival: float, record: bool) -> None:
        self.key, self.req, self.arrival, self.record = key, req, arrival, record
        self.queue: asyncio.Queue[Output] = asyncio.Queue()
        self.first_at: float | None = None
        self.last_at = arrival
        self.generated = 0
        self.cached = 0  # prompt tokens the engine found in its prefix cache
        self.done = False


class EngineRuntime:
    def __init__(
        self,
        sim: EngineSim,
        metrics: EngineMetrics,
        speed: float,
        slow_factor: Callable[[], float],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sim, self.metrics, self.speed = sim, metrics, speed
        self._slow_factor, self._clock = slow_factor, clock
        self._handles: dict[str, RequestHandle] = {}
        self._by_request_id: dict[str, RequestHandle] = {}
        self._keys = itertools.count()
        self._wake = asyncio.Event()
        self._retime = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._recent: deque[tuple[float, int]] = deque()
        self._started_at = clock()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="emulated-engine-loop")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    # -- requests ------------------------------------------------------------------------
    def submit(self, req: ParsedRequest, record: bool = True) -> RequestHandle:
        handle = RequestHandle(f"k{next(self._keys)}", req, self._clock(), record)
        self.sim.add(handle.key, req.prompt_tokens, req.max_tokens, req.block_hashes,
                     req.adapter)
        self._handles[handle.key] = handle
        self._by_request_id[req.request_id] = handle
        self._wake.set()
        return handle

    def abort(self, handle: RequestHandle, notify: bool = False) -> None:
        """Take a request out of the engine now; ``notify`` ends its stream with "abort"."""
        if handle.done:
            return
        self.sim.abort(handle.key)
        self._forget(handle)
        if handle.record:
            self._record_finish(handle, "abort")
        if notify:
            handle.queue.put_nowait(Output("", handle.generated, "abort"))

    def abort_request_id(self, request_id: str) -> bool:
        handle = self._by_request_id.get(request_id)
        if handle is None:
            return False
        self.abort(handle, notify=True)
        return True

    def abort_all(self) -> None:
        for handle in list(self._handles.values()):
            self.abort(handle, notify=True)

    @property
    def in_flight(self) -> int:
        return len(self._handles)

    # -- state ---------------------------------------------------------------------------
    def gen_throughput(self) -> float:
        now = self._clock()
        self._prune(now)
        span = min(THROUGHPUT_WINDOW_S, now - self._started_at)
        return sum(n for _, n in self._recent) / span if span > 0 else 0.0

    def gauges(self) -> EngineGauges:
        sim = self.sim
        counters = sim.counters()
        return EngineGauges(
            running=sim.num_running,
            waiting=sim.num_waiting,
            kv_usage=sim.kv_usage,
            kv_used_tokens=sim.kv_used_tokens,
            kv_capacity_tokens=sim.kv_capacity_tokens,
            gen_throughput=self.gen_throughput(),
            preemptions_total=counters.preemptions_total,
            prefix_queries_total=counters.prefix_queries_total,
            prefix_hits_total=counters.prefix_hits_total,
            lora_running=tuple(sim.running_adapters),
            lora_waiting=tuple(sim.waiting_adapters),
        )

    def state(self) -> dict[str, Any]:
        c = self.sim.counters()
        return {
            "running": self.sim.num_running,
            "waiting": self.sim.num_waiting,
            "in_flight": self.in_flight,
            "aborted": c.aborted_total,
            "finished": c.finished_total,
            "preemptions": c.preemptions_total,
            "kv_usage": self.sim.kv_usage,
            "kv_used_tokens": self.sim.kv_used_tokens,
            "kv_capacity_tokens": self.sim.kv_capacity_tokens,
            "prompt_tokens_total": c.prompt_tokens_total,
            "generation_tokens_total": c.generation_tokens_total,
            "prefix_cache_queries": c.prefix_queries_total,
            "prefix_cache_hits": c.prefix_hits_total,
            "steps": c.steps_total,
            "gen_throughput": self.gen_throughput(),
        }

    # -- the loop ------------------------------------------------------------------------
    def retime(self) -> None:
        """The slow factor changed: re-plan the wait for the step in progress."""
        self._retime.set()

    async def _loop(self) -> None:
        deadline = self._clock()
        while True:
            duration = self.sim.next_step_duration()
            if duration is None:
                self._wake.clear()
                await self._wake.wait()
                deadline = self._clock()
                continue
            if self._clock() - deadline > MAX_LAG_S:
                deadline = self._clock()  # we were held up: do not try to catch up
            deadline = await self._wait_step(deadline, duration)
            events = self.sim.step()
            self.metrics.on_step(self.sim.last_step_tokens)
            self._deliver(events, self._clock())

    async def _wait_step(self, start: float, emulated: float) -> float:
        """Sleep until a step of ``emulated`` engine seconds begun at ``start`` is over.

        Returns the step's scheduled end; the next step starts from there, so timer
        oversleep (about 1 ms with uvloop) is paid back instead of piling up.
        """
        while True:
            rate = self.speed / self._slow_factor()  # engine seconds per wall second
            end = start + emulated / rate
            delay = end - self._clock()
            if delay <= 0:
                return end
            self._retime.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._retime.wait()
            if not self._retime.is_set():
                return end
            now = self._clock()
            emulated -= (now - start) * rate
            start = now

    def _deliver(self, events: list[TokenEvent], now: float) -> None:
        produced = 0
        for ev in events:
            handle = self._handles.get(ev.request_id)
            if handle is None:
                continue
            produced += 1
            req = handle.req
            if handle.record:
                if ev.index == 0:
                    self.metrics.on_first_token(now - handle.arrival, req.prompt_tokens, req.stream)
                if not req.pooling:
                    self.metrics.on_token(None if ev.index == 0 else now - handle.last_at)
            if ev.index == 0:
                handle.first_at = now
                handle.cached = ev.cached_tokens
            handle.last_at = now
            handle.generated = ev.index + 1
            finish = req.finish_reason if ev.finished else None
            planned = req.token_text(ev.index, eos=finish == "stop")
            if planned is None:
                text = token_text(ev.index + req.offset, eos=finish == "stop")
            else:
                text = planned
            handle.queue.put_nowait(Output(text, ev.index + 1, finish))
            if ev.finished:
                self._forget(handle)
                if handle.record:
                    self._record_finish(handle, finish or "length")
        if produced:
            self._recent.append((now, produced))

    def _forget(self, handle: RequestHandle) -> None:
        handle.done = True
        self._handles.pop(handle.key, None)
        if self._by_request_id.get(handle.req.request_id) is handle:
            del self._by_request_id[handle.req.request_id]

    def _record_finish(self, handle: RequestHandle, reason: str) -> None:
        now = self._clock()
        tokens = handle.generated
        tpot = None
        if handle.first_at is not None and tokens > 1:
            tpot = (now - handle.first_at) / (tokens - 1)
        self.metrics.on_finish(
            FinishedRequest(
                e2e_s=now - handle.arrival,
                tpot_s=tpot,
                prompt_tokens=handle.req.prompt_tokens,
                completion_tokens=0 if handle.req.pooling else tokens,
                max_tokens=handle.req.max_tokens,
                finish_reason=reason,
                streaming=handle.req.stream,
            )
        )

    def _prune(self, now: float) -> None:
        while self._recent and now - self._recent[0][0] > THROUGHPUT_WINDOW_S:
            self._recent.popleft()
