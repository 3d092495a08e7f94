"""Streaming relay: commit on the first frame, forward frames, end every stream well.

``open_stream`` reads up to the first data frame before anything reaches the client: an
in-band error there (SGLang reports a full queue as HTTP 200 + an SSE error frame) is a
retryable failure of this attempt, not of the request. After that the stream is committed:
frames go out as they come (the model name rewritten, the usage chunk dropped if the client
did not ask for it), and an upstream failure becomes a final error event in the API's shape
(``apis.py``). Nothing is retried after the first byte. A stream ended well is one whose
API end marker (``[DONE]``, ``response.completed``, ``message_stop``) arrived.

May touch: backends (SSE, relay response), starlette responses. Must not touch: routing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from fleetgate.backends.relay import UpstreamError, UpstreamResponse
from fleetgate.backends.sse import (
    DONE,
    SSEFramer,
    frame_data,
    is_usage_only_chunk,
    stream_error,
)
from fleetgate.gateway.errors import envelope, json_error
from fleetgate.gateway.proxy.apis import Api
from fleetgate.gateway.proxy.attempt import Attempt
from fleetgate.gateway.proxy.observer import RequestObserver
from fleetgate.gateway.proxy.outcome import (
    RETRYABLE_STATUS,
    RetryableFailure,
    transport_failure,
    transport_status,
)

if TYPE_CHECKING:
    from fleetgate.gateway.proxy.service import Exchange

log = logging.getLogger("fleetgate.stream")

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


async def open_stream(resp: UpstreamResponse, ex: Exchange, attempt: Attempt,
                      rewrite: Callable[[bytes], bytes], headers: dict[str, str]) -> Response:
    framer = SSEFramer()
    chunks = resp.chunks()
    first: list[bytes] = []
    try:
        while not any(frame_data(f) is not None for f in first):
            first.extend(framer.feed(await anext(chunks)))
    except StopAsyncIteration:
        resp.close()
        raise RetryableFailure(502, f"{attempt.ep.id}: stream ended before its first frame") \
            from None
    except UpstreamError as exc:
        resp.close()
        raise transport_failure(exc, attempt.ep.id) from None
    data = next(d for d in map(frame_data, first) if d is not None)
    err = stream_error(data)
    if err is not None:
        resp.close()
        if err.status in RETRYABLE_STATUS:
            raise RetryableFailure(err.status,
                                   f"{attempt.ep.id}: in-band {err.status}: {err.message}")
        attempt.failed(err.status, err.message, counts_against_engine=err.status >= 500)
        return json_error(err.status, envelope(err.status, err.message, type_=err.type),
                          headers)
    relay = StreamRelay(ex.req.api, ex.req.client_wants_usage, rewrite, attempt)
    body = relay.run(first, framer, chunks, resp, ex.obs)
    response = SSEResponse(body, headers={**headers, **SSE_HEADERS},
                           media_type="text/event-stream; charset=utf-8")
    response.on_close = relay.abandon_unstarted(resp, ex.obs)
    return response


class SSEResponse(StreamingResponse):
    """A StreamingResponse that watches for the client leaving with one plain asyncio task.

    Starlette, under uvicorn's ASGI spec 2.3, runs each stream in an anyio task group whose
    ``cancel()`` formats ``repr(task)``: about 0.4 ms of CPU per stream (BENCHMARKS.md).
    Same behaviour: when the client disconnects, the body iterator is cancelled at its
    current await (the relay closes the upstream connection) and the response just ends.
    """

    on_close: Callable[[], None] | None = None  # cleans up a body that never started

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        streaming = asyncio.current_task()
        assert streaming is not None
        state = {"open": True, "gone": False}

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            if state["open"]:
                state["gone"] = True
                streaming.cancel()

        watcher = asyncio.get_running_loop().create_task(watch())
        try:
            await send({"type": "http.response.start", "status": self.status_code,
                        "headers": self.raw_headers})
            async for chunk in self.body_iterator:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            state["open"] = False
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not state["gone"]:
                raise
            streaming.uncancel()  # our own cancel: the client left, the stream just ends
        finally:
            state["open"] = False
            watcher.cancel()
            if self.on_close is not None:
                self.on_close()


class StreamRelay:
    """Forwards frames, rewrites the model, drops unrequested usage, ends every stream well."""

    def __init__(self, api: Api, client_wants_usage: bool, rewrite: Callable[[bytes], bytes],
                 attempt: Attempt) -> None:
        self.api = api
        self.wants_usage = client_wants_usage
        self.rewrite = rewrite
        self.attempt = attempt
        self.usage: dict[str, int] | None = None
        self.done = False
        self.started = False
        self.first_token_seen = False
        # end events other than ``data: [DONE]`` (Responses, Messages), looked for in the data
        self.end_events = tuple(m for m in api.end_markers if not m.startswith(b"data: "))

    def abandon_unstarted(self, resp: UpstreamResponse,
                          obs: RequestObserver) -> Callable[[], None]:
        """Cleanup for a client that left before the body began (``run`` never ran)."""

        def close() -> None:
            if not self.started:
                resp.close()
                self.attempt.cancelled()
                obs.end(499, "client disconnected")

        return close

    def transform(self, frames: list[bytes]) -> bytes:
        out = []
        for frame in frames:
            data = frame_data(frame)
            if data is None:
                out.append(frame)  # comment / keep-alive
                continue
            if not self.first_token_seen:
                self._maybe_first_token(data)
            if data == DONE:
                self.done = True
                out.append(frame)
                continue
            if self.end_events and not self.done:
                self.done = any(marker in data for marker in self.end_events)
            if b'"usage"' in data and b'"usage":null' not in data:
                self.usage = self.api.stream_usage(data, self.usage)
                if self.wants_usage or not self.api.asks_usage or not is_usage_only_chunk(data):
                    out.append(self.rewrite(frame))
            else:
                out.append(self.rewrite(frame))
        return b"".join(out)

    def _maybe_first_token(self, data: bytes) -> None:
        if self.api.output_marker is None or self.api.output_marker in data:
            self.first_token_seen = True
            self.attempt.first_token()

    async def run(self, first: list[bytes], framer: SSEFramer, chunks: AsyncIterator[bytes],
                  resp: UpstreamResponse, obs: RequestObserver) -> AsyncIterator[bytes]:
        status, error = 499, "client disconnected"
        self.started = True
        try:
            yield self.transform(first)
            async for chunk in chunks:
                out = self.transform(framer.feed(chunk))
                if out:
                    yield out
            if self.done:
                status, error = 200, ""
                self.attempt.finished(self.usage)
            else:
                status, error = 502, "upstream stream ended without its end marker"
                self.attempt.failed(status, error)
                yield self.api.error_frame(status, error)
        except UpstreamError as exc:
            log.warning("stream from %s broke mid-way: %s", self.attempt.ep.id, exc)
            status, error = transport_status(exc), f"upstream failed: {exc}"
            self.attempt.failed(status, error)
            yield self.api.error_frame(status, error)
        finally:
            resp.close()
            self.attempt.cancelled()  # no-op unless the client went away mid-stream
            obs.end(status, error or None)
