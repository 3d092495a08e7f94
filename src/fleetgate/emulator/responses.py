"""HTTP plumbing of an emulated engine: the token-streaming response and the request log.

``EngineResponse`` is a raw ASGI response for one request in the engine: it streams SSE frames
(or collects a JSON body) from the request's token queue through the API's ``StreamSession``
(sessions.py) while watching ``receive`` for ``http.disconnect``; a client that goes away
aborts its request in the engine at once.
``RequestLog`` keeps the last requests received (method, path, headers, body) for
``GET /emulator/requests``.

May touch: asyncio, starlette request/response types, the runtime and wire formats. Must not
touch: routing of paths (server.py), the simulator directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from fleetgate.emulator.faults import Receive, send_json
from fleetgate.emulator.formats import SSE_CONTENT_TYPE
from fleetgate.emulator.runtime import EngineRuntime, RequestHandle
from fleetgate.emulator.sessions import StreamSession


def json_response(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


class RequestLog:
    """The last requests received, for tests to check what a gateway forwarded."""

    def __init__(self, size: int) -> None:
        self._items: deque[dict[str, Any]] = deque(maxlen=size)

    def record(self, request: Request, raw: bytes) -> None:
        try:
            body: Any = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = raw.decode("utf-8", "replace")
        self._items.append(
            {
                "method": request.method,
                "path": request.url.path,
                "headers": dict(request.headers.items()),
                "body": body,
                "received_at": time.time(),
            }
        )

    def items(self) -> list[dict[str, Any]]:
        return list(self._items)

    def clear(self) -> None:
        self._items.clear()


class EngineResponse:
    """Streams (or collects) one request's tokens through its API's session (sessions.py);
    aborts the request if the client disconnects."""

    def __init__(self, runtime: EngineRuntime, session: StreamSession, handle: RequestHandle
                 ) -> None:
        self.runtime, self.session, self.handle = runtime, session, handle

    async def __call__(self, scope: Any, receive: Receive, send: Any) -> None:
        work = asyncio.ensure_future(
            self._stream(send) if self.handle.req.stream else self._complete(send)
        )
        gone = asyncio.ensure_future(wait_disconnect(receive))
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.runtime.abort(self.handle)  # no-op when it already finished
            for task in (work, gone):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await work

    async def _stream(self, send: Any) -> None:
        session = self.session
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", SSE_CONTENT_TYPE.encode())],
            }
        )
        # Like both engines, the first frames go out with the first token (their stream
        # generators emit them on the first engine output), so the first frame marks TTFT.
        opening = session.opening()
        while True:
            out = await self.handle.queue.get()
            payload = opening + session.token(out)
            opening = b""
            if out.finish_reason is not None:
                payload += session.closing(out)
                await send({"type": "http.response.body", "body": payload})
                return
            if payload:
                await send({"type": "http.response.body", "body": payload, "more_body": True})

    async def _complete(self, send: Any) -> None:
        parts: list[str] = []
        while True:
            out = await self.handle.queue.get()
            parts.append(out.text)
            if out.finish_reason is not None:
                break
        await send_json(send, 200, self.session.body("".join(parts), out))


async def wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
