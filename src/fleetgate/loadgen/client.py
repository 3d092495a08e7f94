"""Send one request to an OpenAI-compatible server and time it as ``vllm bench serve`` does.

Definitions (``vllm/benchmarks/lib/endpoint_request_func.py`` and ``serve.py``):

* the clock starts just before the request is sent (``time.perf_counter``);
* a *token chunk* is an SSE event that carries output: a chat or completions chunk with a
  non-empty ``choices`` list (vLLM's first chat chunk, ``{"role": "assistant"}``, counts, as
  it does in vLLM's benchmark: engines send it with the first token), or a Responses
  ``response.output_text.delta`` event; the usage-only chunk and ``[DONE]`` are not;
* TTFT = arrival of the first token chunk - start;
* ITL = the gaps between consecutive token chunks (one per chunk, so a chunk carrying
  several tokens is one gap, as in vLLM);
* latency (e2e) = arrival of the *last token chunk* - start (not the usage chunk);
* output tokens = the usage's ``completion_tokens`` / ``output_tokens``, else the number of
  token chunks; TPOT (``metrics.py``) = (latency - TTFT) / (output tokens - 1).

A chunk's arrival time is taken once per network read. Without streaming there is no TTFT,
ITL or TPOT, only e2e (the whole answer). A request fails on a non-200 status
(``http_<status>``), a stream that carries an error event (``stream_error``), a stream with
no token chunk (``no_tokens``), a timeout, a refused or dropped connection.

May touch: aiohttp, orjson. Must not touch: anything of fleetgate's server side.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
import orjson

Api = Literal["chat", "completions", "responses"]
PATHS: dict[str, str] = {"chat": "/v1/chat/completions", "completions": "/v1/completions",
                         "responses": "/v1/responses"}
POOL_HEADER = "x-fleetgate-pool"


@dataclass(frozen=True)
class Planned:
    """One request to send: when (open loop / replay), how long a prompt, how many tokens."""

    index: int
    prompt_tokens: int
    output_tokens: int
    arrival_s: float | None = None  # None: closed loop (send when a user is free)
    model: str | None = None


@dataclass
class Record:
    """What one request did (times in seconds; ``start`` relative to the run's start)."""

    index: int
    start: float = 0.0
    ok: bool = False
    error_kind: str | None = None
    error: str = ""
    ttft: float | None = None
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int = 0  # the server's count when it sent usage, else the planned one
    pool: str | None = None


def base_url(url: str) -> str:
    """The server root: a trailing ``/`` or ``/v1`` is dropped."""
    url = url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


def request_body(api: Api, model: str, prompt: str, output_tokens: int, stream: bool,
                 ignore_eos: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "stream": stream}
    if api == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
        body["max_completion_tokens"] = output_tokens
    elif api == "completions":
        body["prompt"] = prompt
        body["max_tokens"] = output_tokens
    else:
        body["input"] = prompt
        body["max_output_tokens"] = output_tokens
    if stream and api != "responses":
        body["stream_options"] = {"include_usage": True}
    if ignore_eos:
        body["ignore_eos"] = True
    return body


class _Stream:
    """Incremental SSE parsing of one response into a ``Record``."""

    def __init__(self, rec: Record, api: Api, t0: float) -> None:
        self.rec, self.api, self.t0 = rec, api, t0
        self.buf = b""
        self.last = t0
        self.chunks = 0

    def feed(self, data: bytes, now: float) -> None:
        self.buf += data.replace(b"\r\n", b"\n")
        while True:
            end = self.buf.find(b"\n\n")
            if end < 0:
                return
            event, self.buf = self.buf[:end], self.buf[end + 2:]
            self._event(event, now)

    def _event(self, event: bytes, now: float) -> None:
        data = b"\n".join(line[5:].lstrip() for line in event.split(b"\n")
                          if line.startswith(b"data:"))
        if not data or data == b"[DONE]":
            return
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return
        if not isinstance(obj, dict):
            return
        if self._is_error(obj):
            self.rec.error_kind = self.rec.error_kind or "stream_error"
            self.rec.error = data[:300].decode("utf-8", "replace")
            return
        if self._is_token(obj):
            if self.chunks == 0:
                self.rec.ttft = now - self.t0
            else:
                self.rec.itl.append(now - self.last)
            self.last = now
            self.chunks += 1
        self._usage(obj)

    def _is_error(self, obj: dict[str, Any]) -> bool:
        if self.api == "responses":
            return obj.get("type") in ("error", "response.failed")
        return "error" in obj and not obj.get("choices")

    def _is_token(self, obj: dict[str, Any]) -> bool:
        if self.api == "responses":
            return obj.get("type") == "response.output_text.delta"
        return bool(obj.get("choices"))

    def _usage(self, obj: dict[str, Any]) -> None:
        usage = obj.get("usage")
        if self.api == "responses" and obj.get("type") == "response.completed":
            usage = (obj.get("response") or {}).get("usage")
        if isinstance(usage, dict):
            _apply_usage(self.rec, usage)


def _apply_usage(rec: Record, usage: dict[str, Any]) -> None:
    out = usage.get("completion_tokens", usage.get("output_tokens"))
    prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
    if isinstance(out, int):
        rec.output_tokens = out
    if isinstance(prompt, int):
        rec.prompt_tokens = prompt


async def send(session: aiohttp.ClientSession, url: str, api: Api, body: dict[str, Any],
               rec: Record, clock0: float, headers: dict[str, str]) -> Record:
    """Send ``body`` to ``url`` + the API's path; fill ``rec`` (never raises)."""
    t0 = time.perf_counter()
    rec.start = t0 - clock0
    stream = bool(body.get("stream"))
    try:
        async with session.post(url + PATHS[api], data=orjson.dumps(body),
                                headers=headers) as resp:
            rec.pool = resp.headers.get(POOL_HEADER)
            if resp.status != 200:
                rec.error_kind = f"http_{resp.status}"
                rec.error = (await resp.text())[:300]
                rec.latency = time.perf_counter() - t0
                return rec
            if stream:
                parser = _Stream(rec, api, t0)
                async for data in resp.content.iter_any():
                    parser.feed(data, time.perf_counter())
                rec.latency = parser.last - t0
                if parser.chunks == 0 and rec.error_kind is None:
                    rec.error_kind, rec.error = "no_tokens", "no token chunk in the stream"
                if not rec.output_tokens:
                    rec.output_tokens = parser.chunks
            else:
                raw = await resp.read()
                rec.latency = time.perf_counter() - t0
                obj = orjson.loads(raw)
                if isinstance(obj, dict) and isinstance(obj.get("usage"), dict):
                    _apply_usage(rec, obj["usage"])
    except TimeoutError:
        rec.error_kind, rec.error = "timeout", "request timed out"
    except aiohttp.ClientConnectorError as exc:
        rec.error_kind, rec.error = "connect", str(exc)[:300]
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError) as exc:
        rec.error_kind, rec.error = "disconnected", str(exc)[:300]
    except (aiohttp.ClientError, orjson.JSONDecodeError, ValueError) as exc:
        rec.error_kind, rec.error = "client_error", f"{type(exc).__name__}: {exc}"[:300]
    if rec.error_kind is None:
        rec.ok = True
    else:
        rec.latency = rec.latency or time.perf_counter() - t0
    return rec
