"""The results of ``bench/overhead/run.py``: one measured cell, and the Markdown report."""

from __future__ import annotations

import argparse
import os
import platform
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from host import cpu_model
from systems import LOAD_CPU, SUT_CPU, git_rev

LABELS = {
    "direct": "direct (no proxy)",
    "sglang-router": "sglang-router {v} (Rust)",
    "naive": "naive FastAPI + aiohttp pass-through, ~40 lines",
    "naive-granian": "naive pass-through on granian {v}",
    "fleetgate": "fleetgate, cost policy",
    "fleetgate-granian": "fleetgate, cost policy, on granian {v}",
    "fleetgate-traced": "fleetgate, cost policy, tracing 100 %",
    "fleetgate-base": "fleetgate before (--baseline), cost policy",
    "fleetgate-base-traced": "fleetgate before (--baseline), tracing 100 %",
    "litellm": "LiteLLM proxy {v}",
}


@dataclass
class Cell:
    system: str
    mode: str
    conc: int
    round: int
    requests: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    sut_cpu_s: float = 0.0
    mock_cpu_s: float = 0.0
    load_cpu_s: float = 0.0
    idle_suts_cpu_s: float = 0.0  # the other (idle) SUTs on the same CPU, in the window
    other_pct: float = 0.0  # CPU of processes outside the benchmark, % of all CPUs
    steal_pct: float = 0.0
    done: int = 0
    problem: str | None = None

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    def pct(self, q: float) -> float:
        s = sorted(self.latencies)
        return s[min(len(s) - 1, int(q * len(s)))] * 1000 if s else float("nan")

    def per_req_ms(self, cpu_s: float) -> float:
        return cpu_s * 1000 / self.requests if self.requests else float("nan")

    @property
    def sut_ms(self) -> float:
        return self.per_req_ms(self.sut_cpu_s)

    @property
    def ok(self) -> bool:
        return self.problem is None and self.errors == 0 and self.requests > 0


# ---------------------------------------------------------------- report

def best(cells: list[Cell]) -> dict[tuple[str, str, int], Cell]:
    """Per (system, mode, c): the sound round least disturbed by other processes."""
    groups: dict[tuple[str, str, int], list[Cell]] = {}
    for c in cells:
        groups.setdefault((c.system, c.mode, c.conc), []).append(c)
    return {k: min(g, key=lambda c: (not c.ok, c.other_pct + c.steal_pct))
            for k, g in groups.items()}


def fmt(x: float, spec: str) -> str:
    return "-" if x != x else format(x, spec)  # NaN -> "-"


def fmt_x(x: float) -> str:
    return "n/a" if x != x else f"{x:.2f}x"


def label(name: str, versions: dict[str, dict[str, str]]) -> str:
    v = versions.get(name, {})
    named = v.get("sglang-router") or v.get("litellm") or v.get("granian") or ""
    text = LABELS[name].format(v=named)
    return " ".join(text.split())


def headline(chosen: dict[tuple[str, str, int], Cell], names: list[str],
             missing: dict[str, str], versions: dict[str, dict[str, str]]) -> str:
    lines = ["| one core | plain c=32 req/s | plain c=32 CPU ms/req | stream c=32 req/s "
             "| stream c=32 CPU ms/req | added p50 at c=1, plain / stream (ms) |",
             "|---|--:|--:|--:|--:|--:|"]
    for name in names:
        if name in missing:
            lines.append(f"| {label(name, versions)} | not available: "
                         f"{missing[name].replace('|', '/')[:300]} | - | - | - | - |")
            continue
        cols = []
        for mode in ("plain", "stream"):
            c = chosen.get((name, mode, 32))
            if c is None or not c.requests:
                cols += ["-", "-"]
            else:
                flag = "" if c.ok else " (!)"
                cols += [f"{c.rps:,.0f}{flag}", f"{c.sut_ms:.3f}"]
        added = []
        for mode in ("plain", "stream"):
            c, d = chosen.get((name, mode, 1)), chosen.get(("direct", mode, 1))
            added.append(f"{c.pct(.5) - d.pct(.5):+.2f}" if c and d and c.requests
                         and d.requests else "-")
        lines.append(f"| {label(name, versions)} | " + " | ".join(cols)
                     + f" | {' / '.join(added)} |")
    return "\n".join(lines)


def full_table(chosen: dict[tuple[str, str, int], Cell], names: list[str]) -> str:
    lines = ["| system | mode | c | req/s | p50 ms | p99 ms | added p50 | added p99 "
             "| SUT CPU ms/req | SUT busy % of a core | idle SUTs % | mock CPU ms/req "
             "| loadgen CPU ms/req | other load % | round | errors | check |",
             "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|"]
    for key in sorted(chosen, key=lambda k: (k[1], k[2], (["direct", *names]).index(k[0]))):
        c = chosen[key]
        d = chosen.get(("direct", c.mode, c.conc))
        a50 = a99 = "-"
        if c.system != "direct" and d is not None and c.requests and d.requests:
            a50, a99 = f"{c.pct(.5) - d.pct(.5):+.2f}", f"{c.pct(.99) - d.pct(.99):+.2f}"
        sut = "-" if c.system == "direct" else fmt(c.sut_ms, ".3f")
        busy = "-" if c.system == "direct" or not c.seconds else \
            f"{c.sut_cpu_s / c.seconds * 100:.0f}"
        idle = f"{c.idle_suts_cpu_s / c.seconds * 100:.1f}" if c.seconds else "-"
        lines.append(
            f"| {c.system} | {c.mode} | {c.conc} | {c.rps:,.0f} | {fmt(c.pct(.5), '.2f')} "
            f"| {fmt(c.pct(.99), '.2f')} | {a50} | {a99} | {sut} | {busy} | {idle} "
            f"| {fmt(c.per_req_ms(c.mock_cpu_s), '.3f')} "
            f"| {fmt(c.per_req_ms(c.load_cpu_s), '.3f')} | {c.other_pct:.0f} | {c.round} "
            f"| {c.errors} | {(c.problem or 'ok').replace('|', '/')[:160]} |")
    return "\n".join(lines)


def rounds_table(cells: list[Cell], rounds: int) -> str:
    groups: dict[tuple[str, str, int], list[Cell]] = {}
    for c in cells:
        groups.setdefault((c.system, c.mode, c.conc), []).append(c)
    head = " | ".join(f"round {i + 1}" for i in range(rounds))
    lines = [f"| system | mode | c | {head} |", "|---|---|--:|" + "---|" * rounds]
    for (system, mode, conc), g in groups.items():
        cells_txt = []
        for c in g:
            cpu = "" if system == "direct" else f", {c.sut_ms:.3f} ms CPU"
            cells_txt.append(f"{c.rps:,.0f}/s, p50 {fmt(c.pct(.5), '.2f')}{cpu} "
                             f"({c.other_pct:.0f}%)" + ("" if c.ok else " (!)"))
        lines.append(f"| {system} | {mode} | {conc} | " + " | ".join(cells_txt) + " |")
    return "\n".join(lines)


def ratio_lines(chosen: dict[tuple[str, str, int], Cell]) -> list[str]:
    def get(system: str, mode: str, conc: int) -> Cell | None:
        c = chosen.get((system, mode, conc))
        return c if c is not None and c.requests else None

    def ratio(num: Cell | None, den: Cell | None, what: Callable[[Cell], float]) -> float:
        return what(num) / what(den) if num and den and what(den) else float("nan")

    def verdict(x: float, at_least: float | None = None, at_most: float | None = None) -> str:
        if x != x:
            return "n/a"
        ok = (at_least is None or x >= at_least) and (at_most is None or x <= at_most)
        return "meets" if ok else "**misses**"

    def rps(c: Cell) -> float:
        return c.rps

    def cpu(c: Cell) -> float:
        return c.sut_ms

    out = []
    for mode in ("plain", "stream"):
        fg = get("fleetgate", mode, 32)
        x = ratio(fg, get("naive", mode, 32), cpu)
        out.append(f"- {mode}, c=32: fleetgate CPU/req / naive = {fmt_x(x)} "
                   "(lower is better)")
        x = ratio(fg, get("naive", mode, 32), rps)
        out.append(f"- {mode}, c=32: fleetgate req/s / naive = {fmt_x(x)} "
                   f"(target >= 1.2x: {verdict(x, at_least=1.2)})")
        target = 0.6 if mode == "plain" else 1.0
        x = ratio(fg, get("sglang-router", mode, 32), rps)
        out.append(f"- {mode}, c=32: fleetgate req/s / sglang-router = {fmt_x(x)} "
                   f"(target >= {target:g}x: {verdict(x, at_least=target)})")
        x = ratio(fg, get("litellm", mode, 32), cpu)
        inv = f"1/{1 / x:.0f}" if x == x and x > 0 else "n/a"
        out.append(f"- {mode}, c=32: fleetgate CPU/req / LiteLLM = {inv} "
                   f"(target <= 1/50: {verdict(x, at_most=1 / 50)})")
        c1, d1 = get("fleetgate", mode, 1), get("direct", mode, 1)
        x = c1.pct(.5) - d1.pct(.5) if c1 and d1 else float("nan")
        out.append(f"- {mode}, c=1: fleetgate added p50 = {fmt(x, '+.3f')} ms "
                   f"(target <= 0.5 ms: {verdict(x, at_most=0.5)})")
        x = ratio(get("fleetgate-traced", mode, 32), fg, cpu)
        out.append(f"- {mode}, c=32: fleetgate CPU/req, tracing 100 % / off = {fmt_x(x)} "
                   f"(target <= 1.10x: {verdict(x, at_most=1.10)})")
    out += issue26_lines(set(chosen), get, ratio, verdict)
    return out


def issue26_lines(keys: set[tuple[str, str, int]], get: Callable[[str, str, int], Cell | None],
                  ratio: Callable[[Cell | None, Cell | None, Callable[[Cell], float]], float],
                  verdict: Callable[..., str]) -> list[str]:
    """Issue 26's targets against the naive pass-through, and the change against the
    baseline's code where ``--baseline`` ran it."""
    def cpu(c: Cell) -> float:
        return c.sut_ms

    def rps(c: Cell) -> float:
        return c.rps

    out = ["", "Issue 26 (against the naive pass-through, same run):"]
    for mode in ("plain", "stream"):
        for conc in sorted({k for (s, m, k) in keys if s == "fleetgate" and m == mode}):
            x = ratio(get("fleetgate", mode, conc), get("naive", mode, conc), cpu)
            out.append(f"- {mode}, c={conc}: CPU/req fleetgate / naive = {fmt_x(x)} "
                       f"(target <= 1.0x: {verdict(x, at_most=1.0)})")
    x = ratio(get("fleetgate", "plain", 32), get("naive", "plain", 32), rps)
    out.append(f"- plain, c=32: req/s fleetgate / naive = {fmt_x(x)} "
               f"(target >= 1.0x: {verdict(x, at_least=1.0)})")
    for mode in ("plain", "stream"):
        fg, nv, d = get("fleetgate", mode, 1), get("naive", mode, 1), get("direct", mode, 1)
        if fg and nv and d:
            a, b = fg.pct(.5) - d.pct(.5), nv.pct(.5) - d.pct(.5)
            out.append(f"- {mode}, c=1: added p50 fleetgate {a:+.3f} ms, naive {b:+.3f} ms "
                       f"(target fleetgate <= naive: {verdict(a - b, at_most=0.0)})")
    for mode in ("plain", "stream"):
        x = ratio(get("fleetgate-traced", mode, 32), get("fleetgate", mode, 32), cpu)
        out.append(f"- {mode}, c=32: CPU/req tracing 100 % / off = {fmt_x(x)} "
                   f"(target <= 1.10x: {verdict(x, at_most=1.10)})")
    base = [k for k in keys if k[0] == "fleetgate-base"]
    if base:
        out += ["", "Against the baseline's code (--baseline), same run, CPU/req after / "
                "before:"]
        for _, mode, conc in sorted(base, key=lambda k: (k[1], k[2])):
            x = ratio(get("fleetgate", mode, conc), get("fleetgate-base", mode, conc), cpu)
            y = ratio(get("fleetgate", mode, conc), get("fleetgate-base", mode, conc), rps)
            out.append(f"- {mode}, c={conc}: CPU/req {fmt_x(x)}, req/s {fmt_x(y)}")
        for mode in ("plain", "stream"):
            x = ratio(get("fleetgate-traced", mode, 32), get("fleetgate-base-traced", mode, 32),
                      cpu)
            if x == x:
                out.append(f"- {mode}, c=32, tracing 100 %: CPU/req {fmt_x(x)}")
    return out


def machine(versions: dict[str, dict[str, str]]) -> list[str]:
    model = cpu_model()
    lines = [f"- CPU: {model}, {os.cpu_count()} cores; Linux {platform.release()}; "
             f"Python {platform.python_version()} (this script, fleetgate, naive)"]
    for name, v in versions.items():
        lines.append(f"- {name}: " + ", ".join(f"{k} {ver}" for k, ver in v.items()))
    return lines


def report(cells: list[Cell], names: list[str], missing: dict[str, str],
           versions: dict[str, dict[str, str]], notes: list[str],
           args: argparse.Namespace) -> str:
    chosen = best(cells)
    method = (
        f"Each system under test pinned alone to CPU {SUT_CPU} (all started up front, the "
        f"others idle meanwhile: *idle SUTs %* is what they used of that CPU during the "
        f"window); `bench/mock_engine.py` (instant, vLLM-shaped, 16 content chunks a stream, "
        f"back to back) and the load generator (raw asyncio HTTP/1.1, one keep-alive "
        f"connection per user, closed loop; `bench/loadgen.py`) pinned to CPU {LOAD_CPU}. "
        f"`/v1/chat/completions` plain or stream (with `stream_options.include_usage`), "
        f"c = {', '.join(map(str, args.concurrency))}. {args.rounds} round(s), each running "
        f"every scenario on every system in turn: warm-up >= {args.warmup_s:g} s and until c "
        f"responses completed (at most {args.max_warmup_s:g} s), then {args.window_s:g} s "
        f"measured. Each cell is the round with the least CPU used by processes outside the "
        f"benchmark (*other load*, % of all CPUs; every round is listed at the end). "
        f"Latency: request write to last response byte; *added* = system minus direct, same "
        f"mode and c. CPU ms/req: utime+stime of the system's whole process tree over the "
        f"window / responses completed in it. Every response must be 200 and the first of "
        f"each cell is checked in full; a cell with a problem is marked (!). "
        f"{'Request logs off (--quiet-logs).' if args.quiet_logs else 'Logs at each system default (fleetgate: one JSON line per request, to a file; sglang-router: info, to a file).'}")  # noqa: E501
    run_line = (f"Produced by `bench/overhead/run.py {' '.join(sys.argv[1:])}` at "
                f"{time.strftime('%Y-%m-%d %H:%M')} on commit {git_rev()} plus the working "
                f"tree of that moment.")
    text = ["# Proxy overhead side by side", "",
            textwrap.fill(run_line, 92, break_on_hyphens=False), "",
            "**Machine.**", "", *machine(versions), "",
            "**Method.** " + textwrap.fill(method, 92, break_on_hyphens=False), "",
            "Busy CPU of the load generator's core limits the *direct* rows and any system "
            "faster than it; a SUT at ~100 % of its core is CPU-bound.", "",
            headline(chosen, names, missing, versions), "",
            "**Against the targets** (fleetgate = cost policy, tracing off):", "",
            *ratio_lines(chosen), ""]
    if notes:
        text += ["**Notes.**", "", *[f"- {n}" for n in notes], ""]
    text += ["## Every cell (best round)", "", full_table(chosen, ["direct", *names]), "",
             "## Every round: req/s, p50 ms, SUT CPU ms/req (other load %)", "",
             rounds_table(cells, args.rounds), ""]
    return "\n".join(text)
