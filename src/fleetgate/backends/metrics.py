"""Engine ``/metrics`` parsing: the metric-name table per engine and the load parser.

The collector scrapes every endpoint's Prometheus exposition about once a second and turns
it into an :class:`EngineLoad`. Engine differences are data (the catalog's ``MetricNames``
per engine), not subclasses. Names and semantics follow vLLM 0.33.0
(``vllm/v1/metrics/loggers.py``) and SGLang 0.5.23
(``sglang/srt/observability/metrics_collector.py``); see ``docs/engines.md`` §1.2, §2.2, §6.

Aggregation rules (a replica can expose several series of one family):

* Replica-internal labels (``tp_rank``, ``pp_rank``, ``moe_ep_rank``, ``pid``, ...) do not
  split load: ranks of one tensor/pipeline-parallel group report the same scheduler state
  (SGLang ``--enable-metrics-for-all-schedulers``), so series differing only in those
  labels are collapsed with ``max``. Everything else (vLLM ``engine``, SGLang ``dp_rank``,
  ``is_streaming``, ``model_name``) splits load: counts and counters are **summed**,
  ratios (KV usage) are **averaged**.
* SGLang with priority scheduling writes totals under ``priority=""`` and per-priority
  breakdowns under ``priority="<n>"``; only the totals are read.
* ``NaN`` and infinite values mean "unknown" and are skipped; a signal with no finite value
  is ``None``. ``None`` always means "signal unavailable", never 0: vLLM with
  ``--disable-log-stats`` has no ``vllm:`` families at all. KV usage is clamped to [0, 1].
* Names: SGLang may use ``sglang:`` or ``sglang_`` (``/v1/loads?format=prometheus``, which
  also calls the queue ``num_waiting_reqs``); vLLM falls back to the pre-V1
  ``vllm:gpu_cache_usage_perc`` when ``vllm:kv_cache_usage_perc`` is absent.
* Counters are matched by their exposed sample name (``..._total``), so prometheus_client
  stripping ``_total`` from counter family names does not matter.

Speed: prometheus_client's parser takes 25-40 ms on a full engine exposition (histograms),
so only the few lines naming wanted metrics are found (``str.find``, then the rest of that
family's group) and parsed. The whole text is still checked, cheaply, for lines that cannot be
exposition at all (an HTML or JSON body): that raises :class:`MetricsParseError`.

May touch: prometheus_client's text parser, ``re``, ``math``. Must not touch: HTTP, clocks,
routing, config (pure functions of the text; the collector owns I/O and error counting).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields

from prometheus_client.parser import text_string_to_metric_families

from fleetgate.catalog.engines import ENGINES, MetricNames

_RATIO_SIGNALS = frozenset({"kv_usage"})
_REPLICA_INTERNAL_LABELS = frozenset(
    {"tp_rank", "pp_rank", "moe_ep_rank", "attn_tp_rank", "attn_cp_rank", "pid"}
)


class MetricsParseError(ValueError):
    """The scraped body is not Prometheus text exposition (or a wanted line is malformed)."""


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """Load signals from one scrape. ``None`` = signal unavailable, never a stand-in for 0."""

    waiting: float | None = None
    running: float | None = None
    kv_usage: float | None = None
    """Fraction of KV-cache capacity in use, 0..1 (averaged over data-parallel ranks)."""
    generation_tokens_total: float | None = None
    prompt_tokens_total: float | None = None
    gen_throughput: float | None = None
    """Engine-reported generation tokens/s (SGLang gauge; vLLM has none)."""
    preemptions_total: float | None = None
    """Cumulative preemptions (vLLM) / retractions (SGLang)."""

    @property
    def has_signals(self) -> bool:
        """True if at least one signal was read."""
        return any(getattr(self, name) is not None for name in SIGNALS)


SIGNALS = tuple(f.name for f in fields(EngineLoad))
"""The EngineLoad fields, each read from the metric named by the same MetricNames field."""


METRIC_NAMES: dict[str, MetricNames | None] = {name: spec.metrics for name, spec in ENGINES.items()}
"""Per engine, the names of its load signals (the catalog's rows)."""


# The first character of a line of exposition: a comment or a metric name. A body whose
# first or last line starts otherwise is not exposition (an HTML page, a JSON error body, a
# text cut short by a proxy). These work on the body's bytes, as the engine sent them.
_LINE_START = re.compile(rb"[#a-zA-Z_:]")
_INDENTED = re.compile(rb"^[ \t]+", re.MULTILINE)
_BLANK = b" \t\r\n"
# A sample line in the canonical form both engines write (labels, value, optional timestamp).
# Label values are matched as runs between escapes, not one character at a time through an
# alternation: half the time on a line of vLLM's (0.7 us against 1.6).
_SAMPLE = re.compile(
    r'([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{((?:[a-zA-Z_]\w*="[^"\\\n]*(?:\\.[^"\\\n]*)*",?)*)\})?'
    r"[ \t]+([-+]?(?:[0-9.]+(?:[eE][-+]?[0-9]+)?|Inf|NaN))(?:[ \t]+-?[0-9]+)?[ \t]*\r?"
)
_LABEL = re.compile(r'([a-zA-Z_]\w*)="([^"\\\n]*(?:\\.[^"\\\n]*)*)"')
# The same on the body's bytes, at a line's place (no slice, no decoding of the whole line):
# where it matches, the text regex would too, with the same groups once decoded; where it
# does not (a non-ASCII label name, which ``\w`` in text allows), the line is decoded and
# goes the text way.
_SAMPLE_BYTES = re.compile(_SAMPLE.pattern.encode())

# (labels, value): labels as written (read only when needed: ``_labels``) or as parsed
Series = list[tuple[str | dict[str, str], float]]


def _labels(labels: str | dict[str, str]) -> dict[str, str]:
    return labels if isinstance(labels, dict) else dict(_LABEL.findall(labels))


def _prepare(body: bytes) -> bytes:
    """``body`` once its first and last lines are seen to be exposition; raises
    MetricsParseError if they are not. The lines in between are not checked (a scan of
    every line cost a third of the parse): only the wanted ones are read, and strictly."""
    if body[:1] in (b" ", b"\t"):  # rare: indented lines; the format ignores the blanks
        body = _INDENTED.sub(b"", body)
    start = 0
    while start < len(body) and body[start] in _BLANK:
        start += 1
    end = len(body)
    while end > start and body[end - 1] in _BLANK:
        end -= 1
    last = body.rfind(b"\n", start, end) + 1
    for at in (start, max(last, start)):
        if at < end and _LINE_START.match(body, at) is None:
            line = body[at:].split(b"\n", 1)[0].decode("utf-8", "replace")
            raise MetricsParseError(f"not Prometheus text exposition: {line[:80]!r}")
    return body


# How far before its last place a family is looked for first (values change length a little
# from one scrape to the next; a family that moved further is found from the start).
_HINT_SLACK = 1024


def _family(body: bytes, name: str, raw: bytes, needle: bytes,
            hints: dict[bytes, int] | None) -> Series | None:
    """The samples of metric ``name`` (``raw``: as bytes; ``needle``: after a newline) in
    ``body``, or None when no sample line of it is there.

    ``bytes.find`` finds the first: ~1 us to a line 5 KB in, ~19 us through 63 KB for a
    name that is absent. With ``hints`` (where each family was in this engine's last body;
    updated here) the search starts just before that place, and what it finds is taken only
    if a comment line (the family's TYPE) comes right before it: then it is the family's
    first sample, else the search starts over from the beginning. The rest of the family is
    looked for only up to the next comment line, since the format keeps a family's samples
    in one group after its HELP and TYPE lines.

    Canonical lines take a regex fast path, on the bytes where they lie (prometheus_client's
    parser costs ~40 us a line); any other line goes through prometheus_client, which also
    reports malformed ones. One function, not one call per step: this runs for every wanted
    family of every endpoint every tick.
    """
    if body.startswith(raw):
        at = -1  # where the line's newline would be
    else:
        at = -1
        if hints is not None:
            hint = hints.get(raw)
            if hint is not None:
                at = body.find(needle, hint - _HINT_SLACK if hint > _HINT_SLACK else 0)
                if at > 0:
                    begin = body.rfind(b"\n", 0, at) + 1
                    if body[begin:begin + 1] != b"#":
                        at = -1
                else:
                    at = -1
        if at < 0:
            at = body.find(needle)
            if at < 0:
                return None
        if hints is not None:
            hints[raw] = at
    end = body.find(b"\n#", at if at > 0 else 0)
    if end < 0:
        end = len(body)
    series: Series = []
    slow: list[str] = []
    found, after = False, len(needle)
    while True:
        stop = body.find(b"\n", at + 1)
        if stop < 0:
            stop = len(body)
        if body[at + after:at + after + 1] in _AFTER_NAME:  # not a longer name
            found = True
            m = _SAMPLE_BYTES.fullmatch(body, at + 1, stop)
            if m is not None:
                labels = m.group(2)
                series.append((labels.decode("utf-8", "replace") if labels else "",
                               float(m.group(3))))
            else:
                line = body[at + 1:stop].decode("utf-8", "replace")
                t = _SAMPLE.fullmatch(line)
                if t is None:
                    slow.append(line)
                else:
                    series.append((t.group(2) or "", float(t.group(3))))
        if stop >= end:
            break
        at = body.find(needle, stop, end)
        if at < 0:
            break
    if not found:
        return None
    if slow:
        series += _parse_slow(slow).get(name, [])
    return series


_AFTER_NAME = (b"{", b" ", b"\t")


def _parse_slow(lines: list[str]) -> dict[str, Series]:
    """Lines off the fast path, through prometheus_client (which reports malformed ones)."""
    out: dict[str, Series] = {}
    try:
        for family in text_string_to_metric_families("\n".join(lines) + "\n"):
            for sample in family.samples:
                out.setdefault(sample.name, []).append((sample.labels, sample.value))
    except ValueError as exc:  # prometheus_client raises ValueError on malformed lines
        raise MetricsParseError(f"malformed metric line: {exc}") from exc
    return out


def _per_replica(series: Series) -> list[float]:
    """Finite values, one per load-splitting label set (max over replica-internal labels)."""
    if len(series) == 1:  # the common case: one engine, one series
        raw, value = series[0]
        if "priority" in raw and _labels(raw).get("priority", ""):
            return []
        return [value] if math.isfinite(value) else []
    groups: dict[tuple[tuple[str, str], ...], float] = {}
    for raw, value in series:
        labels = _labels(raw)
        if not math.isfinite(value) or labels.get("priority", ""):
            continue
        key = tuple(sorted((k, v) for k, v in labels.items() if k not in _REPLICA_INTERNAL_LABELS))
        prev = groups.get(key)
        groups[key] = value if prev is None else max(prev, value)
    return list(groups.values())


def _aggregate(signal: str, series: Series) -> float | None:
    values = _per_replica(series)
    if not values:
        return None
    if signal in _RATIO_SIGNALS:
        return min(1.0, max(0.0, sum(values) / len(values)))
    return float(sum(values))


def _resolve_table(body: bytes, engine: str) -> str | None:
    """The METRIC_NAMES key whose names to read: ``engine``'s, or a guess for unknown servers."""
    if engine not in METRIC_NAMES:
        raise ValueError(f"unknown engine {engine!r}; expected one of {sorted(METRIC_NAMES)}")
    if METRIC_NAMES[engine] is not None:
        return engine
    if b"vllm:" in body:
        return "vllm"
    if b"sglang:" in body or b"sglang_" in body:
        return "sglang"
    return None


def parse_engine_metrics(text: str | bytes, engine: str,
                         hints: dict[bytes, int] | None = None) -> EngineLoad:
    """Read an :class:`EngineLoad` from ``/metrics`` text of an ``engine`` server (the body
    as it came: bytes; only the lines read are decoded).

    ``engine`` is a key of :data:`METRIC_NAMES` ("vllm", "sglang", "openai"); "openai"
    reads whichever engine's families the text contains. ``hints``: a dict kept per
    endpoint between its scrapes (where each family was), so that each family is looked for
    near its last place, not from the start of the text. Raises :class:`MetricsParseError`
    if the text is not Prometheus exposition, ``ValueError`` for an unknown engine.
    """
    body = text.encode() if isinstance(text, str) else text
    key = _resolve_table(body, engine)
    body = _prepare(body)
    if key is None or METRIC_NAMES[key] is None:
        return EngineLoad()
    values: dict[str, float | None] = dict.fromkeys(SIGNALS)
    for signal, names in _WANTED[key]:
        for name, raw, needle in names:  # the first name the engine exposes
            series = _family(body, name, raw, needle, hints)
            if series is not None:
                if series:
                    values[signal] = _aggregate(signal, series)
                break
    return EngineLoad(**values)


# Per engine, (signal, the names to try for it, best first, as text, as bytes and after a
# newline), for the signals it has.
_WANTED = {key: tuple((signal, tuple((name, name.encode(), b"\n" + name.encode())
                                     for name in names))
                      for signal in SIGNALS if (names := table.candidates(signal)))
           for key, table in METRIC_NAMES.items() if table is not None}
