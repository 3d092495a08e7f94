"""The client's side of one exchange: noticing that it left, and the SSE response it reads.

``ClientWatch`` is one asyncio task per proxied request, started once the body has been
read (the next ``receive`` is the disconnect) and living until the answer has been sent.
When the client disconnects while it is armed, it cancels the task serving the request:

* before the answer (a non-streamed request, or a stream before its first byte), the
  attempt ends through its ``cancelled()`` path (the relay closes the upstream connection,
  so the engine aborts the request): nothing is computed for nobody, charged and logged as
  served, nor does it keep its concurrency slot; the handler answers 499 to no one;
* during a stream (``SSEResponse``), the body iterator is cancelled at its current await,
  the relay closes upstream, and the response just ends.

Under the gateway's server (``gateway/server.py``) the watch is no task at all: the server's
protocol calls the request's ``on_disconnect`` hook when the connection is lost while the
answer is unfinished, the moment uvicorn itself would mark it disconnected. A task that
waits on ``receive()`` cost a task, its two steps, an event waiter and a cancellation per
request (BENCHMARKS.md, issue 26); it remains for any other server (tests' ASGI transports).

One task covers both phases. (Starlette's ``StreamingResponse``, under uvicorn's ASGI spec
2.3, runs each stream in an anyio task group whose ``cancel()`` formats ``repr(task)``:
about 0.4 ms of CPU per stream, BENCHMARKS.md.)

``SSEResponse`` also ends a stream at the server's shutdown deadline (``gateway/server.py``
sets ``stop``): at its next frame, with the API's error event (and ``[DONE]``), the relay
closed. One flag test per frame.

May touch: asyncio, starlette responses. Must not touch: routing, backends.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

HOOK = "on_disconnect"  # the attribute of a request cycle the server calls (server.py)


class ClientWatch:
    """Cancels the current task when the client disconnects, while armed (module doc)."""

    __slots__ = ("_armed", "_owner", "_task", "gone")

    def __init__(self, receive: Receive) -> None:
        owner = asyncio.current_task()
        assert owner is not None
        self._owner = owner
        self._armed = True
        self.gone = False
        self._task: asyncio.Task[None] | None = None
        cycle = getattr(receive, "__self__", None)  # uvicorn's request cycle, under ours
        if cycle is not None and getattr(cycle, HOOK, False) is None:
            setattr(cycle, HOOK, self._left)
            cycle.flow.resume_reading()  # as receive() would: a disconnect must be read
            if cycle.disconnected:  # before the hook was set: as the task's first step
                owner.get_loop().call_soon(self._left)
            return
        self._task = owner.get_loop().create_task(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self._left()

    def _left(self) -> None:
        if self._armed:
            self.gone = True
            self._owner.cancel()

    def close(self) -> None:
        """The answer is out (or the request failed): stop watching."""
        self._armed = False
        if self._task is not None:
            self._task.cancel()

    def left(self) -> bool:
        """In an ``except CancelledError``: True when the cancellation was this watch's (the
        client left; the task is uncancelled and may return), False when it was not."""
        if not self.gone:
            return False
        self._owner.uncancel()
        return True


class SSEResponse(StreamingResponse):
    """A stream whose client is watched by the request's ``ClientWatch`` (module doc)."""

    on_close: Callable[[], None] | None = None  # cleans up a body that never started
    watch: ClientWatch | None = None  # handed over by the handler; one of our own if None
    stop: asyncio.Event | None = None  # the server's shutdown deadline has passed
    shutdown_frame: bytes = b""  # the API's error event for it

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watch = self.watch or ClientWatch(receive)
        frames: AsyncIterator[bytes] = self.body_iterator  # type: ignore[assignment]
        stop = self.stop
        try:
            await send({"type": "http.response.start", "status": self.status_code,
                        "headers": self.raw_headers})
            async for chunk in frames:
                if stop is not None and stop.is_set():
                    chunk = self.shutdown_frame
                    await send({"type": "http.response.body", "body": chunk,
                                "more_body": True})
                    break
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            watch.close()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not watch.left():
                raise  # not the client's doing (the server is stopping): propagate
        finally:
            watch.close()
            close = getattr(frames, "aclose", None)
            if close is not None:
                with contextlib.suppress(Exception):
                    await close()
            if self.on_close is not None:
                self.on_close()
