"""Continuous batching on one engine replica: a pure, deterministic, clock-free simulation.

``EngineSim`` keeps the waiting queue and the running batch of one replica and answers two
questions: how long the next engine step takes (``next_step_duration``) and what it produces
(``step``: which requests got a token, which finished). The caller owns time: the emulator's
asyncio loop sleeps ``duration / speed`` between the two calls, the calibration script and
the fleet simulator add it to a virtual clock. Nothing here reads a clock or awaits.

Scheduling follows vLLM v1 (SGLang is close enough at this level):

* each step first gives every running sequence that finished its prefill one decode token,
  then continues partial prefills, then admits waiting requests in FIFO order, all within a
  token budget of ``max_num_batched_tokens`` (chunked prefill: a long prompt is spread over
  several steps and shares each step with the decodes);
* a request is admitted only while ``running < max_num_seqs`` and the KV cache (``K_max``
  tokens, hardware.kv_capacity_tokens) can hold its prompt plus ``kv_reserve_ratio`` of the
  output it may still produce (0 = vLLM, which admits on the prompt alone; 1 = TensorRT-LLM's
  guaranteed-no-evict; SGLang reserves a fraction through its ``new_token_ratio``);
* when the decodes of the next step do not fit in the KV cache, the most recently admitted
  request is preempted (vLLM "recompute": its KV is freed, it goes back to the head of the
  queue and re-prefills prompt + generated tokens when readmitted), and that step admits
  no waiting request (vLLM v1's scheduler: ``if not preempted_reqs``);
* the step that completes a prefill samples that request's next token, so TTFT = queueing +
  every step until the last prefill chunk; each later step adds one token (ITL = step time).

Step durations come from ``catalog.roofline.step_seconds`` (gpus.md §4.1 roofline).

LoRA adapters (``add(..., adapter=NAME)``): a step whose batch runs requests of k distinct
adapters takes ``lora_step_seconds(k)`` longer (``stepcost.py``). As vLLM v1's scheduler
does, a waiting request is skipped (not admitted, the queue behind it goes on) while the
running batch already has ``max_loras`` other adapters (``SchedulerConfig.max_loras``; 0: no
limit).

Prefix caching (prefixcache.py): a request may bring its prompt's chained block hashes; at
admission the cached leading blocks skip prefill (they count as KV already in the cache).
Without hashes a request is never a hit, and everything is as without a cache.

Decode runs (for the fleet simulator): while the batch only decodes and nothing can join it,
the coming steps differ only by the KV tokens they read, so ``plan_decode_run`` describes
them as one ``DecodeRun`` (each step's duration, in closed form) and ``run_decode`` applies
any prefix of it at once: the same tokens, counters and step times as stepping one by one,
without a Python loop over the batch per step (``DecodeRun``, decoderun.py). The live
emulator keeps stepping.

May touch: fleetgate.catalog. Must not touch: asyncio, clocks, I/O, HTTP.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

from fleetgate.catalog.gpus import GpuSpec
from fleetgate.catalog.models import ModelProfile
from fleetgate.catalog.roofline import StepLoad, kv_capacity_tokens, step_seconds
from fleetgate.emulator.decoderun import DecodeRun
from fleetgate.emulator.engine_io import SchedulerConfig, SimCounters, TokenEvent
from fleetgate.emulator.prefixcache import PrefixCache
from fleetgate.emulator.stepcost import (
    decode_run,
    decode_seconds,
    linear_fit,
    lora_adapter_seconds,
    lora_step_seconds,
)


@dataclass(eq=False, slots=True)
class _Seq:
    """One request. While it decodes (``epoch0 >= 0``) ``generated`` and ``kv`` are as of
    decode epoch ``epoch0``; the engine adds the decode steps since (``_materialise``)."""

    request_id: str
    prompt_tokens: int
    max_tokens: int
    generated: int = 0
    kv: int = 0  # KV-cache tokens allocated (the whole prefill target is allocated at admission)
    prefill_left: int = 0
    state: str = "waiting"  # waiting | running | done
    epoch0: int = -1  # decode epoch its counts refer to; -1 while not decoding
    ticket: int = 0  # tells its current finish-heap entry from stale ones
    hashes: tuple[int, ...] = ()  # prefix-cache block hashes of the prompt
    cached: int = -1  # prompt tokens found cached at first admission (-1: not admitted yet)
    adapter: str | None = None  # the LoRA adapter it runs with (None: the base model)

    @property
    def remaining(self) -> int:
        return self.max_tokens - self.generated


@dataclass
class _Plan:
    duration: float
    tokens: int
    decodes: int = 0  # decoding sequences when the step was planned
    chunks: list[tuple[_Seq, int]] = field(default_factory=list)


class EngineSim:
    """One replica's scheduler and cost model. See the module docstring.

    Decoding sequences are counted lazily: a decode step advances one epoch counter and the
    sums the scheduler needs (KV in use, KV read, outputs still to come) follow from
    per-sequence offsets, so a step costs O(prefill chunks + finishes), not O(batch); a
    heap ordered by the epoch each sequence finishes at yields the finishes.
    """

    def __init__(
        self,
        gpu: GpuSpec,
        profile: ModelProfile,
        tp: int = 1,
        stack: str = "stock",
        scheduler: SchedulerConfig | None = None,
    ) -> None:
        self.gpu, self.profile, self.tp, self.stack = gpu, profile, tp, stack
        self.scheduler = scheduler or SchedulerConfig()
        gpu.eta_bw.get(stack)  # validates the stack name
        self.kv_capacity_tokens = kv_capacity_tokens(
            gpu, profile, tp, self.scheduler.gpu_memory_utilization, self.scheduler.workspace_gb
        )
        if self.kv_capacity_tokens <= 0:
            raise ValueError(f"{profile.name} weights do not fit on {tp} x {gpu.name}")
        self._seqs: dict[str, _Seq] = {}
        self._waiting: deque[_Seq] = deque()  # lazily skips aborted entries
        self._num_waiting = 0
        self._running: dict[str, _Seq] = {}  # admission order: the last one is preempted first
        self._prefilling: dict[str, _Seq] = {}  # the running ones still prefilling, same order
        self._kv_pre = self._rem_pre = 0  # KV held / outputs to come of the prefilling ones
        self._epoch = 0  # decode steps so far
        self._n_dec = 0  # decoding sequences
        self._kv_dec = self._rem_dec = 0  # their sums of (kv - epoch0), (remaining + epoch0)
        self._finishes: list[tuple[int, int, _Seq]] = []  # (finish epoch, ticket, seq)
        self._tickets = 0
        self._plan: _Plan | None = None
        self._linear: dict[int, tuple[float, float] | None] = {}  # batch -> decode step fit
        self.prefix_cache = PrefixCache()
        self._prompt_total = self._gen_total = self._preempted = 0
        self._preempting = False  # plan_decode_run preempted: the next step admits nobody
        self._finished = self._aborted = self._steps = 0
        self.last_step_tokens = 0
        self._lora: dict[str, int] = {}  # adapter -> running sequences using it
        self._lora_each_s = lora_adapter_seconds(gpu, profile, tp)

    # -- requests ------------------------------------------------------------------------
    def add(self, request_id: str, prompt_tokens: int, max_tokens: int,
            block_hashes: tuple[int, ...] = (), adapter: str | None = None) -> None:
        """Queue a request that will produce exactly ``max_tokens`` tokens (``block_hashes``:
        its prompt's prefix-cache blocks, prefixcache.py; ``adapter``: the LoRA adapter it
        runs with)."""
        if request_id in self._seqs:
            raise ValueError(f"request {request_id!r} is already in the engine")
        if prompt_tokens < 1 or max_tokens < 1:
            raise ValueError("prompt_tokens and max_tokens must be >= 1")
        if prompt_tokens + max_tokens > self.kv_capacity_tokens:
            raise ValueError(
                f"{prompt_tokens}+{max_tokens} tokens exceed the KV capacity "
                f"({self.kv_capacity_tokens} tokens)"
            )
        seq = _Seq(request_id, prompt_tokens, max_tokens, hashes=block_hashes, adapter=adapter)
        self._seqs[request_id] = seq
        self._waiting.append(seq)
        self._num_waiting += 1

    def abort(self, request_id: str) -> bool:
        """Remove a request at once and free its KV cache; False if it is not in the engine."""
        seq = self._seqs.pop(request_id, None)
        if seq is None:
            return False
        if seq.state == "running":
            self._release(seq)
        else:
            self._num_waiting -= 1
        seq.state = "done"
        self._aborted += 1
        return True

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._seqs

    # -- stepping ------------------------------------------------------------------------
    def next_step_duration(self) -> float | None:
        """Seconds the next step takes, or None when there is nothing to run."""
        if self._plan is None:
            self._plan = self._make_plan()
        return None if self._plan is None else self._plan.duration

    def step(self, every_token: bool = True) -> list[TokenEvent]:
        """Run the planned step: every scheduled request advances; returns the new tokens
        (``every_token=False``: only first tokens and the tokens that finish a request, the
        simulator's view; the step itself is the same)."""
        plan = self._plan if self._plan is not None else self._make_plan()
        self._plan = None
        if plan is None:
            return []
        events: list[TokenEvent] = []
        if plan.decodes and self._n_dec:
            if every_token:
                events += [TokenEvent(s.request_id, s.generated + self._epoch - s.epoch0,
                                      s.max_tokens - s.generated == self._epoch - s.epoch0 + 1)
                           for s in self._running.values() if s.epoch0 >= 0]
            self._advance_decodes(1, events if not every_token else None)
        for seq, n in plan.chunks:
            if seq.state == "running":
                seq.prefill_left -= n
                if seq.prefill_left == 0:
                    if seq.generated == 0:
                        self._prompt_total += seq.prompt_tokens
                    events.append(self._complete_prefill(seq))
        self._steps += 1
        self.last_step_tokens = plan.tokens
        return events

    # -- decode runs (the fleet simulator's shortcut; same results as stepping) ------------
    def plan_decode_run(self, max_steps: int) -> DecodeRun | None:
        """The next steps as one run when they only decode an unchanged batch, else None.

        That holds while every running request has finished its prefill, nothing can be
        admitted (the queue is empty, or ``max_num_seqs`` is reached, or its head does not
        fit: decoding only fills the cache, so it stays so until a request finishes) and the
        KV cache has room for every decode (no preemption). The run ends at the first
        finish, at ``max_steps``, or before the cache would overflow. Stepping through it
        gives the same tokens at the same times; ``run_decode`` applies any prefix of it at
        once. None when fewer than two steps qualify (then step normally).
        """
        if self._plan is not None or not self._running:
            return None
        self._preempting = self._ensure_decode_room()  # the next step is planned with it
        if self._prefilling or not self._n_dec or self._admissible():
            return None
        steps = min(max_steps, self._next_finish() - self._epoch,
                    (self.kv_capacity_tokens - self.kv_used_tokens) // self._n_dec)
        if steps < 2:
            return None
        return self._decode_run(self._n_dec, self._kv_dec + self._n_dec * self._epoch, steps)

    def run_decode(self, steps: int) -> list[TokenEvent]:
        """Apply the first ``steps`` steps of the planned decode run at once; returns only
        the tokens that finished a request."""
        self._plan = None
        if steps > 0:  # the step that preempted has run: the next may admit again
            self._preempting = False
        events: list[TokenEvent] = []
        batch = self._n_dec
        self._advance_decodes(steps, events)
        self._steps += steps
        self.last_step_tokens = batch
        return events

    # -- state for metrics ---------------------------------------------------------------
    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return self._num_waiting

    @property
    def kv_used_tokens(self) -> int:
        return self._kv_pre + self._kv_dec + self._n_dec * self._epoch

    @property
    def kv_usage(self) -> float:
        """Fraction of the KV cache in use, 0..1 (vllm:kv_cache_usage_perc, sglang:token_usage)."""
        return self.kv_used_tokens / self.kv_capacity_tokens

    @property
    def running_adapters(self) -> list[str]:
        """The LoRA adapters of the running batch (vllm:lora_requests_info)."""
        return sorted(self._lora)

    @property
    def waiting_adapters(self) -> list[str]:
        return sorted({s.adapter for s in self._waiting if s.state == "waiting" and s.adapter})

    def lora_step_seconds(self, adapters: int) -> float:
        """What ``adapters`` distinct LoRA adapters in a batch add to its step."""
        return lora_step_seconds(self._lora_each_s, adapters)

    def waiting_prompt_tokens(self) -> int:
        return sum(s.prompt_tokens + s.generated for s in self._waiting if s.state == "waiting")

    def counters(self) -> SimCounters:
        return SimCounters(
            self._prompt_total,
            self._gen_total,
            self._preempted,
            self._finished,
            self._aborted,
            self._steps,
            self.prefix_cache.queries,
            self.prefix_cache.hits,
        )

    # -- internals -----------------------------------------------------------------------
    def _make_plan(self) -> _Plan | None:
        preempted = self._ensure_decode_room() or self._preempting
        self._preempting = False
        budget = self.scheduler.max_num_batched_tokens - self._n_dec
        plan = _Plan(duration=0.0, tokens=0, decodes=self._n_dec)
        kv_read = attention = float(self._kv_dec + self._n_dec * self._epoch)
        prefilling = list(self._prefilling.values())
        admitted = [] if preempted else self._admit_while(budget, prefilling)
        for seq in prefilling + admitted:
            n = min(seq.prefill_left, budget)
            if n <= 0:
                break
            done = seq.kv - seq.prefill_left  # tokens of this prefill already in the cache
            plan.chunks.append((seq, n))
            budget -= n
            kv_read += done + n
            attention += n * (done + n / 2)
        plan.tokens = self._n_dec + sum(n for _, n in plan.chunks)
        if plan.tokens == 0:
            return None
        load = StepLoad(tokens=plan.tokens, kv_tokens_read=kv_read, attention_pairs=attention)
        plan.duration = step_seconds(self.gpu, self.profile, load, self.tp, self.stack) \
            + self.lora_step_seconds(len(self._lora))
        return plan

    def _admit_while(self, budget: int, prefilling: list[_Seq]) -> list[_Seq]:
        budget -= sum(s.prefill_left for s in prefilling)
        admitted: list[_Seq] = []
        skipped: list[_Seq] = []  # over max_loras: they keep their place in the queue
        while budget > 0 and self._waiting and len(self._running) < self.scheduler.max_num_seqs:
            seq = self._waiting[0]
            if seq.state != "waiting":
                self._waiting.popleft()
                continue
            if self._lora_blocked(seq):
                skipped.append(self._waiting.popleft())
                continue
            if self._running and not self._fits(seq):
                break
            self._waiting.popleft()
            self._num_waiting -= 1
            self._start(seq)
            admitted.append(seq)
            budget -= seq.prefill_left
        self._waiting.extendleft(reversed(skipped))
        return admitted

    def _lora_blocked(self, seq: _Seq) -> bool:
        """A new adapter while the batch already runs ``max_loras`` others (vLLM v1 skips
        such a request this step)."""
        cap = self.scheduler.max_loras
        return bool(cap and seq.adapter is not None and seq.adapter not in self._lora
                    and len(self._lora) >= cap)

    def _admissible(self) -> bool:
        """Whether the head of the queue would be admitted into the next step."""
        while self._waiting and self._waiting[0].state != "waiting":
            self._waiting.popleft()
        if not self._num_waiting or len(self._running) >= self.scheduler.max_num_seqs:
            return False
        head: _Seq | None = self._waiting[0]
        if self.scheduler.max_loras and head is not None and self._lora_blocked(head):
            head = next((s for s in self._waiting
                         if s.state == "waiting" and not self._lora_blocked(s)), None)
        return head is not None and self._fits(head)

    def _fits(self, seq: _Seq) -> bool:
        ratio = self.scheduler.kv_reserve_ratio
        remaining = self._rem_pre + self._rem_dec - self._n_dec * self._epoch  # running ones
        claimed = self.kv_used_tokens + ratio * remaining
        need = seq.prompt_tokens + seq.generated + ratio * seq.remaining
        return claimed + need <= self.kv_capacity_tokens

    def _start(self, seq: _Seq) -> None:
        seq.state = "running"
        seq.kv = seq.prompt_tokens + seq.generated
        cache = self.prefix_cache
        hit = min(cache.lookup(seq.hashes) * cache.block_tokens, seq.kv - 1)
        if seq.cached < 0:
            seq.cached = hit
            cache.count(seq.prompt_tokens, hit)
        cache.hold(seq.hashes)
        cache.trim((self.kv_capacity_tokens - self.kv_used_tokens - seq.kv) // cache.block_tokens)
        seq.prefill_left = seq.kv - hit
        self._kv_pre += seq.kv
        self._rem_pre += seq.remaining
        self._running[seq.request_id] = seq
        self._prefilling[seq.request_id] = seq
        if seq.adapter is not None:
            self._lora[seq.adapter] = self._lora.get(seq.adapter, 0) + 1

    def _complete_prefill(self, seq: _Seq) -> TokenEvent:
        """The step that ends a prefill samples the next token; the request then decodes."""
        del self._prefilling[seq.request_id]
        self._kv_pre -= seq.kv
        self._rem_pre -= seq.remaining
        index = seq.generated
        seq.generated += 1
        self._gen_total += 1
        cached = seq.cached if index == 0 else 0
        if seq.generated >= seq.max_tokens:
            self._done(seq)
            return TokenEvent(seq.request_id, index, True, cached)
        seq.epoch0 = self._epoch
        self._tickets += 1
        seq.ticket = self._tickets
        self._n_dec += 1
        self._kv_dec += seq.kv - seq.epoch0
        self._rem_dec += seq.remaining + seq.epoch0
        heapq.heappush(self._finishes, (seq.epoch0 + seq.remaining, seq.ticket, seq))
        return TokenEvent(seq.request_id, index, False, cached)

    def _advance_decodes(self, steps: int, finished: list[TokenEvent] | None) -> None:
        """``steps`` decode steps for every decoding request; releases those that finish
        (appending their last token to ``finished`` when given)."""
        self._epoch += steps
        self._gen_total += steps * self._n_dec
        heap = self._finishes
        while heap and heap[0][0] <= self._epoch:
            _, ticket, seq = heapq.heappop(heap)
            if seq.ticket != ticket or seq.epoch0 < 0:
                continue  # preempted or aborted since
            self._materialise(seq)
            if finished is not None:
                finished.append(TokenEvent(seq.request_id, seq.generated - 1, True))
            self._done(seq)

    def _next_finish(self) -> int:
        heap = self._finishes
        while heap and (heap[0][2].ticket != heap[0][1] or heap[0][2].epoch0 < 0):
            heapq.heappop(heap)
        return heap[0][0] if heap else self._epoch

    def _materialise(self, seq: _Seq) -> None:
        """Take a decoding request out of the lazy sums with its counts brought up to date."""
        self._n_dec -= 1
        self._kv_dec -= seq.kv - seq.epoch0
        self._rem_dec -= seq.remaining + seq.epoch0
        advanced = self._epoch - seq.epoch0
        seq.generated += advanced
        seq.kv += advanced
        seq.epoch0 = -1

    def _release(self, seq: _Seq) -> None:
        if seq.epoch0 >= 0:
            self._materialise(seq)
        elif seq.request_id in self._prefilling:
            del self._prefilling[seq.request_id]
            self._kv_pre -= seq.kv
            self._rem_pre -= seq.remaining
        del self._running[seq.request_id]
        self.prefix_cache.release(seq.hashes)
        self._lora_off(seq)
        seq.kv = 0

    def _lora_off(self, seq: _Seq) -> None:
        if seq.adapter is not None:
            left = self._lora.get(seq.adapter, 0) - 1
            if left > 0:
                self._lora[seq.adapter] = left
            else:
                self._lora.pop(seq.adapter, None)

    def _done(self, seq: _Seq) -> None:
        if self._running.pop(seq.request_id, None) is not None:
            self.prefix_cache.release(seq.hashes)
            self._lora_off(seq)
        seq.kv, seq.state = 0, "done"
        del self._seqs[seq.request_id]
        self._finished += 1

    def _ensure_decode_room(self) -> bool:
        """Preempt (LIFO) until every decoding request can append one KV token; whether any
        was preempted (vLLM v1 then admits no waiting request in that step)."""
        preempted = False
        while self._running:
            if self.kv_used_tokens + self._n_dec <= self.kv_capacity_tokens:
                return preempted
            preempted = True
            victim = next(reversed(self._running.values()))
            self._release(victim)
            victim.state = "waiting"
            self._waiting.appendleft(victim)
            self._num_waiting += 1
            self._preempted += 1
        return preempted

    def _decode_run(self, batch: int, kv0: int, steps: int) -> DecodeRun:
        """Step j reads ``kv0 + j*batch`` KV tokens. Per batch size the step time is checked
        once for being linear in the tokens read over the whole cache (it is, unless the
        step crosses the roofline's ridge); then a run costs no roofline evaluation."""
        if batch not in self._linear:
            self._linear[batch] = self._linear_fit(batch, 0, self.kv_capacity_tokens)
        fit = self._linear[batch] or self._linear_fit(batch, kv0, kv0 + (steps - 1) * batch)
        lora = self.lora_step_seconds(len(self._lora))  # the batch, so its adapters, is fixed
        return decode_run(batch, kv0, steps, fit, lambda kv: self._decode_seconds(batch, kv),
                          lora)

    def _decode_seconds(self, batch: int, kv_read: float) -> float:
        return decode_seconds(self.gpu, self.profile, self.tp, self.stack, batch, kv_read)

    def _linear_fit(self, batch: int, lo: float, hi: float) -> tuple[float, float] | None:
        return linear_fit(lambda kv: self._decode_seconds(batch, kv), lo, hi)
