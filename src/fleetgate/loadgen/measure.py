"""One bench run end to end: the plan, the gateway's ledger before and after, the run, the
``bench --json`` object (DESIGN.md §1, with the run's settings and every request's figures
beside the summary).

May touch: the other loadgen modules, httpx (one ``/v1/models`` read when no model is
given). Must not touch: printing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from fleetgate.loadgen import costs, metrics
from fleetgate.loadgen.client import Api, Record, base_url
from fleetgate.loadgen.plan import Plan, from_flags, from_trace, from_workload, parse_lengths
from fleetgate.loadgen.prompts import APPROXIMATION, prompt_maker
from fleetgate.loadgen.run import Target, run_plan

DEFINITIONS = ("as vllm bench serve: TTFT = first token chunk - send; TPOT = (e2e - TTFT) / "
               "(output tokens - 1), requests with > 1 output token; ITL = gaps between token "
               "chunks, pooled; e2e = last token chunk - send; throughputs over the run's "
               "duration (first send to last completion); good = TTFT <= slo.ttft_ms and "
               "TPOT <= slo.tpot_ms")


@dataclass
class BenchOptions:
    url: str
    model: str | None = None
    api: Api = "chat"
    stream: bool = True
    ignore_eos: bool = False
    headers: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 600.0
    concurrency: int | None = None
    rate: float | None = None
    burstiness: float = 1.0
    requests: int | None = None
    duration_s: float | None = None
    input_tokens: str = "512"
    output_tokens: str = "128"
    workload: Path | None = None
    trace: Path | None = None
    speedup: float = 1.0
    seed: int = 0
    tokenizer: str | None = None
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    admin_key: str | None = None
    warmup: int = 1


def build_plan(o: BenchOptions) -> Plan:
    if o.workload is not None:
        return from_workload(o.workload, o.requests, o.duration_s, o.seed)
    if o.trace is not None:
        return from_trace(o.trace, o.requests, o.duration_s, o.speedup)
    if o.rate is None and o.concurrency is None:
        raise ValueError("give --concurrency C (closed loop) or --rate R (open loop), "
                         "or a --workload / --trace to replay")
    return from_flags(parse_lengths(o.input_tokens), parse_lengths(o.output_tokens),
                      o.requests, o.duration_s, o.rate, o.burstiness, o.seed)


def first_model(base: str, headers: dict[str, str]) -> str:
    try:
        data = httpx.get(base + "/v1/models", headers=headers, timeout=10.0).json()
        return str(data["data"][0]["id"])
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise ValueError(f"no --model given and {base}/v1/models did not name one: "
                         f"{exc}") from None


def slo_of(o: BenchOptions, plan: Plan) -> tuple[float, float] | None:
    ttft = o.slo_ttft_ms if o.slo_ttft_ms is not None else (plan.slo.ttft_ms if plan.slo else None)
    tpot = o.slo_tpot_ms if o.slo_tpot_ms is not None else (plan.slo.tpot_ms if plan.slo else None)
    if ttft is None and tpot is None:
        return None
    return (ttft if ttft is not None else float("inf"), tpot if tpot is not None else float("inf"))


async def measure(o: BenchOptions, on_record: Callable[[Record], None] | None = None,
                  plan: Plan | None = None) -> dict[str, Any]:
    base = base_url(o.url)
    plan = plan or build_plan(o)
    model = o.model or plan.model or first_model(base, o.headers)
    slo = slo_of(o, plan)
    prompts = prompt_maker(o.tokenizer, o.seed)
    target = Target(base, model, o.api, o.stream, o.ignore_eos, o.headers, o.timeout_s)
    before = costs.read_ledger(base, o.admin_key)
    result_run = await run_plan(plan, target, prompts, o.concurrency, o.warmup, on_record)
    after = costs.read_ledger(base, o.admin_key)
    out = metrics.report(result_run.records, result_run.duration_s, slo)
    spent = costs.cost_delta(before, after)
    for name, group in [("overall", out["overall"]), *out["pools"].items()]:
        if name in spent:
            group["usd"] = spent[name]["usd"]
            group["usd_per_mtok"] = spent[name]["usd_per_mtok"]
    if not spent:
        out["costs_note"] = before.error or after.error
    mode = "closed" if plan.closed else ("open" if plan.source == "flags" else "replay")
    out["run"] = {
        "url": base, "model": model, "api": o.api, "stream": o.stream, "mode": mode,
        "concurrency": o.concurrency, "rate": o.rate if plan.source == "flags" else None,
        "burstiness": o.burstiness, "source": plan.source, "planned": plan.total,
        "duration_limit_s": o.duration_s, "duration_s": round(result_run.duration_s, 4),
        "started_at": round(result_run.started_at, 3), "seed": o.seed,
        "input_tokens": o.input_tokens if plan.source == "flags" else None,
        "output_tokens": o.output_tokens if plan.source == "flags" else None,
        "slo": None if slo is None else {"ttft_ms": slo[0], "tpot_ms": slo[1]},
        "prompt_lengths": (f"exact for tokenizer {o.tokenizer}" if prompts.exact
                           else APPROXIMATION),
        "ignore_eos": o.ignore_eos, "definitions": DEFINITIONS,
    }
    out["per_request"] = metrics.per_request(result_run.records, slo)
    return out


def options_json(o: BenchOptions) -> dict[str, Any]:
    d = asdict(o)
    d["headers"] = sorted(d["headers"])  # names only: values may be keys
    d["admin_key"] = bool(o.admin_key)
    return {k: str(v) if isinstance(v, Path) else v for k, v in d.items()}
