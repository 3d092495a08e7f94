"""What a running engine reports about its capacity: KV cache, batch cap, context, model.

Read by the collector at the first successful contact with an endpoint and again after it
restarts or reconnects (and, as a safety net, every ``CAPACITY_REFRESH_S``), never on every
scrape: none of it changes while an engine runs. The engine's catalog row names the
sources (``catalog/engines.py``); every source is optional and read independently, so a
missing one (an old engine, a server that is not vLLM or SGLang) only leaves its fields
unknown (``None``) and the prior's guess in place.

* vLLM: ``vllm:cache_config_info`` in ``/metrics``, an info gauge (value 1) whose labels are
  the engine's ``CacheConfig`` as strings (``vllm/v1/metrics/loggers.py``
  ``log_metrics_info``; ``vllm/config/cache.py`` ``metrics_info``), one series per engine
  (data-parallel rank, label ``engine``). KV tokens of one engine = ``kv_cache_size_tokens``
  when the label holds a number (newer vLLM: group-aware), else ``num_gpu_blocks *
  block_size``; summed over engines. ``GET /v1/models``: ``max_model_len`` of the cards.
  vLLM does not report ``max_num_seqs``: the batch cap stays the prior's.
* SGLang: ``GET /server_info`` (``/get_server_info`` before it was renamed; ``http_server.py``
  ``get_server_info``): the server args (``context_length`` when set, ``max_running_requests``,
  ``page_size``, ``tp_size``, ``dp_size``), the scheduler's ``max_total_num_tokens`` and, per
  DP rank, ``internal_states`` with ``memory_usage`` (``weight`` and ``kvcache`` in GiB per
  TP rank, ``token_capacity``) and ``effective_max_running_requests_per_dp``. KV tokens and
  the batch cap are summed over DP ranks. ``GET /v1/models``: ``max_model_len``;
  ``GET /model_info`` (``/get_model_info``): ``architectures``.

The model's shape as SGLang reports it (KV bytes per token, weight bytes, from its memory
pool) is kept for ``/admin/endpoints``; the step-cost prior is not rebuilt from it (the
router's learned corrections take care of the speed).

Reads go out on the control plane's client (``backends/http1.py``, the instance the
collector probes and scrapes with: ``backends/probes.py``), each with one timeout for
connect, first byte and the whole answer. A body over ``MAX_BODY_BYTES`` (the collector's
bound on a scrape) reads as nothing.

May touch: the relay client, orjson, ``re``. Must not touch: routing, clocks, the live state.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace
from typing import Any

import orjson

from fleetgate.backends.http1 import Http1Backend
from fleetgate.backends.relay import Timeouts, UpstreamError
from fleetgate.catalog.engines import EngineSpec

GIB = float(1 << 30)
MAX_BODY_BYTES = 16 * 1024 * 1024  # as a scrape (state/collector.py MAX_SCRAPE_BYTES)
_LABEL = re.compile(r'([a-zA-Z_]\w*)="((?:[^"\\\n]|\\.)*)"')


@dataclass(frozen=True, slots=True)
class EngineCapacity:
    """An engine's report of itself; ``None`` = not reported."""

    kv_capacity_tokens: int | None = None
    block_size: int | None = None
    max_model_len: int | None = None
    max_batch: int | None = None
    architecture: str | None = None
    kv_bytes_per_token: float | None = None
    weight_bytes: float | None = None

    @property
    def empty(self) -> bool:
        return all(getattr(self, f.name) is None for f in fields(self))

    def merged(self, other: EngineCapacity) -> EngineCapacity:
        """This report with ``other``'s known fields filled in where this one has none."""
        return replace(self, **{f.name: getattr(other, f.name) for f in fields(self)
                                if getattr(self, f.name) is None})

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _int(value: Any) -> int | None:
    """A positive integer from JSON or a label string ("16", 16, "None" -> None)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value > 0 else None
    if isinstance(value, float):
        return int(value) if value >= 1 else None
    if isinstance(value, str) and value.strip().isdigit():
        return int(value) or None
    return None


def parse_cache_config_info(text: str, metric: str) -> EngineCapacity:
    """KV tokens and block size from vLLM's ``vllm:cache_config_info`` series in ``text``."""
    line = re.compile(rf"^{re.escape(metric)}\{{([^\n]*)\}}[ \t]+\S+", re.MULTILINE)
    total, block = 0, None
    for labels_text in line.findall(text):
        labels = dict(_LABEL.findall(labels_text))
        size = _int(labels.get("block_size"))
        tokens = _int(labels.get("kv_cache_size_tokens"))
        blocks = _int(labels.get("num_gpu_blocks"))
        if tokens is None and blocks is not None and size is not None:
            tokens = blocks * size
        if tokens is not None:
            total += tokens
        block = block or size
    return EngineCapacity(kv_capacity_tokens=total or None, block_size=block)


def parse_model_cards(obj: Any) -> EngineCapacity:
    """``max_model_len`` from an OpenAI ``/v1/models`` body (the smallest of the cards)."""
    cards = obj.get("data") if isinstance(obj, dict) else None
    cards = [c for c in cards if isinstance(c, dict)] if isinstance(cards, list) else []
    lengths = [n for c in cards if (n := _int(c.get("max_model_len"))) is not None]
    return EngineCapacity(max_model_len=min(lengths) if lengths else None)


def parse_server_info(obj: Any) -> EngineCapacity:
    """KV tokens, batch cap, page size, context and memory shape from SGLang's server info."""
    if not isinstance(obj, dict):
        return EngineCapacity()
    states: list[dict[str, Any]] = [s for s in obj.get("internal_states") or []
                                    if isinstance(s, dict)]
    memory: list[dict[str, Any]] = [m for s in states
                                    if isinstance(m := s.get("memory_usage"), dict)]
    capacities = [_int(m.get("token_capacity")) for m in memory]
    kv: int | None
    if capacities and all(c is not None for c in capacities):
        kv = sum(c for c in capacities if c is not None)
    else:
        per_rank = _int(obj.get("max_total_num_tokens"))
        kv = per_rank * (_int(obj.get("dp_size")) or 1) if per_rank is not None else None
    caps = [_int(s.get("effective_max_running_requests_per_dp")) for s in states]
    if caps and all(c is not None for c in caps):
        batch: int | None = sum(c for c in caps if c is not None)
    else:
        batch = _int(obj.get("max_running_requests"))
    kv_bytes = weight_bytes = None
    if memory:
        tp = _int(obj.get("tp_size")) or 1
        first = memory[0]
        kv_gib, tokens, weight_gib = (first.get("kvcache"), _int(first.get("token_capacity")),
                                      first.get("weight"))
        if isinstance(kv_gib, int | float) and kv_gib > 0 and tokens:
            kv_bytes = round(kv_gib * GIB * tp / tokens, 1)
        if isinstance(weight_gib, int | float) and weight_gib > 0:
            weight_bytes = round(weight_gib * GIB * tp)
    return EngineCapacity(kv_capacity_tokens=kv, block_size=_int(obj.get("page_size")),
                          max_model_len=_int(obj.get("context_length")), max_batch=batch,
                          kv_bytes_per_token=kv_bytes, weight_bytes=weight_bytes)


def parse_model_info(obj: Any) -> EngineCapacity:
    """The architecture from SGLang's model info."""
    archs = obj.get("architectures") if isinstance(obj, dict) else None
    first = archs[0] if isinstance(archs, list) and archs else None
    return EngineCapacity(architecture=first if isinstance(first, str) else None)


async def read_capacity(client: Http1Backend, base_url: str, spec: EngineSpec,
                        timeout: float = 2.0,
                        headers: dict[str, str] | None = None) -> EngineCapacity:
    """Everything ``spec``'s sources report (each read on its own; failures leave ``None``;
    ``headers``: the endpoint's credentials, if its pool has an ``api_key``).

    The model cards come first: a server's own ``max_model_len`` beats a context that its
    server info only repeats from the command line."""
    limit = _Limit(Timeouts(connect=timeout, read=timeout, total=timeout), headers)
    out = EngineCapacity()
    if spec.models_path:
        out = out.merged(parse_model_cards(await _get_json(client, base_url, (spec.models_path,),
                                                           limit)))
    if spec.capacity_metric and spec.metrics_path:
        text = await _get_text(client, base_url, (spec.metrics_path,), limit)
        if text is not None:
            out = out.merged(parse_cache_config_info(text, spec.capacity_metric))
    if spec.server_info_paths:
        out = out.merged(parse_server_info(await _get_json(client, base_url,
                                                           spec.server_info_paths, limit)))
    if spec.model_info_paths:
        out = out.merged(parse_model_info(await _get_json(client, base_url,
                                                          spec.model_info_paths, limit)))
    return out


@dataclass(frozen=True, slots=True)
class _Limit:
    """How each read is made: its timeouts and the endpoint's credentials."""

    timeouts: Timeouts
    headers: dict[str, str] | None


async def _get(client: Http1Backend, base_url: str, paths: tuple[str, ...],
               limit: _Limit) -> bytes | None:
    """The body of the first of ``paths`` that answers 200 (a 404 tries the next one)."""
    for path in paths:
        try:
            resp = await client.get(base_url + path, limit.headers, limit.timeouts)
            body = await resp.read()  # to its end: the connection is kept for the next read
        except UpstreamError:
            return None
        if resp.status == 200:
            return body if len(body) <= MAX_BODY_BYTES else None
        if resp.status != 404:
            return None
    return None


async def _get_text(client: Http1Backend, base_url: str, paths: tuple[str, ...],
                    limit: _Limit) -> str | None:
    body = await _get(client, base_url, paths, limit)
    try:
        return body.decode("utf-8") if body is not None else None
    except UnicodeDecodeError:
        return None


async def _get_json(client: Http1Backend, base_url: str, paths: tuple[str, ...],
                    limit: _Limit) -> Any:
    body = await _get(client, base_url, paths, limit)
    if body is None:
        return None
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
