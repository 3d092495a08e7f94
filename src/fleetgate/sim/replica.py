"""One simulated engine replica: the emulator's ``EngineSim`` driven by a virtual clock.

The live emulator (``emulator/runtime.py``) asks ``EngineSim`` how long its next step takes,
sleeps that long, runs the step and hands out the tokens. ``SimReplica`` does the same on a
virtual clock, with one shortcut that changes no result: while the batch only decodes and
nothing can join it (``EngineSim.plan_decode_run``), a run of identical steps is one event,
not one per step. It ends at the first finish (or the KV cache filling up) and is cut short
when something happens in between:

* a request arrives: the step in progress completes as planned (the engine plans a step when
  it starts it, so an arrival joins the next one, exactly as live) and the run ends there;
* a scrape reads the gauges part-way: the steps completed by then are counted without
  ending the run (``gauges``);
* the replica is slowed down or goes down (injected faults).

Step durations are the engine's, times ``slow / speed`` (``speed``: an ``emulated://``
endpoint's ``?speed=``; 1 for a real GPU, the question the simulator answers).

May touch: the emulator's perf model. Must not touch: routing, live state, wall clocks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fleetgate.emulator.perfmodel import DecodeRun, EngineSim, TokenEvent

MAX_RUN_STEPS = 4096  # a decode run longer than this is split (bounds its cumulative table)


@dataclass(frozen=True, slots=True)
class Gauges:
    """What a scrape of the engine's /metrics reads."""

    waiting: int
    running: int
    kv_usage: float
    generation_tokens_total: int


class SimReplica:
    __slots__ = (
        "_end",
        "_factory",
        "_run",
        "_scale",
        "_start",
        "_steps",
        "engine",
        "slow",
        "speed",
        "up",
    )

    hosted = False  # an engine we run (sim/hosted.py: someone else's API)
    full = False  # it queues whatever it is sent

    def __init__(self, factory: Callable[[], EngineSim], speed: float = 1.0) -> None:
        self._factory = factory
        self.engine = factory()
        self.speed = speed
        self.slow = 1.0
        self.up = True
        self._scale = 1.0 / speed
        self._run: DecodeRun | None = None  # None while a single general step runs
        self._steps = 0  # steps of the run that will have completed at _end
        self._start = 0.0
        self._end: float | None = None  # when the step or run in progress ends

    @property
    def next_time(self) -> float | None:
        return self._end

    @property
    def kv_capacity_tokens(self) -> int:
        return self.engine.kv_capacity_tokens

    def add(self, key: str, prompt_tokens: int, max_tokens: int, now: float,
            block_hashes: tuple[int, ...] = (), adapter: str | None = None) -> bool:
        """Queue a request at ``now`` (``block_hashes``: its prompt's prefix-cache blocks;
        ``adapter``: the LoRA adapter it runs with); True when ``next_time`` changed
        (reschedule it)."""
        self.engine.add(key, prompt_tokens, max_tokens, block_hashes, adapter)
        return self._interrupt(now)

    def advance(self) -> list[TokenEvent]:
        """Complete what ends at ``next_time``; plan the next step from then."""
        end = self._end
        if end is None:
            return []
        if self._run is None:
            events = self.engine.step(every_token=False)
        else:
            events = self.engine.run_decode(self._steps)
        self._plan(end)
        return events

    def gauges(self, now: float) -> Gauges:
        """The engine's gauges at ``now``, counting the decode steps completed by then."""
        eng = self.engine
        extra = 0
        run = self._run
        if run is not None and self._end is not None and now < self._end:
            done = min(run.steps_done((now - self._start) / self._factor()), self._steps)
            extra = done * run.batch
        used = eng.kv_used_tokens + extra
        return Gauges(eng.num_waiting, eng.num_running, used / eng.kv_capacity_tokens,
                      eng.counters().generation_tokens_total + extra)

    def set_slow(self, factor: float, now: float) -> bool:
        """Steps from the next one on take ``factor`` times as long; True: reschedule."""
        changed = self._interrupt(now)
        self.slow = factor
        return changed

    def go_down(self) -> None:
        """Lose every request (the process died); refuse new ones until ``come_up``."""
        self.engine = self._factory()
        self.up = False
        self._run, self._end = None, None

    def come_up(self) -> None:
        self.up = True

    # -- internals -----------------------------------------------------------------------
    def _factor(self) -> float:
        return self.slow * self._scale

    def _interrupt(self, now: float) -> bool:
        """Something changed at ``now``: end the run after the step in progress."""
        if self._end is None:
            self._plan(now)
            return self._end is not None
        run = self._run
        if run is None:
            return False  # a single step: whatever arrived joins the next plan anyway
        done = run.steps_done((now - self._start) / self._factor())
        steps = min(self._steps, done + 1)
        if steps == self._steps:
            return False
        self._steps = steps
        self._end = self._start + run.elapsed(steps) * self._factor()
        return True

    def _plan(self, now: float) -> None:
        self._start = now
        run = self.engine.plan_decode_run(MAX_RUN_STEPS)
        if run is not None:
            self._run, self._steps = run, run.steps
            self._end = now + run.elapsed(run.steps) * self._factor()
            return
        self._run = None
        duration = self.engine.next_step_duration()
        self._end = None if duration is None else now + duration * self._factor()
