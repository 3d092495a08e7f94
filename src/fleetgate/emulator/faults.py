"""Fault injection for an emulated engine, switchable at run time over ``/emulator/faults``.

Knobs (``POST /emulator/faults`` with any subset; ``GET`` reads them back):

* ``fail_next`` N / ``fail_status`` S: the next N inference requests (POST /v1/chat/completions,
  /v1/completions, /v1/responses, /v1/messages, /v1/embeddings) answer HTTP S (default 503)
  with the engine's error body (its chat shape, on every path), before any work is done;
* ``hang``: every engine route accepts the request and then answers nothing until ``hang``
  is cleared (the request body is read and held; a client that gives up is dropped);
* ``slow_factor`` F: every engine step takes F times longer (read by the engine loop);
* ``down``: every engine route, health included, answers 503 at once with the engine's error
  body (we chose an answer over dropped connections: it is deterministic, and a refused
  connection is what a stopped emulator process gives anyway).

``/emulator/*`` itself is never affected, so a test can always clear what it set.

May touch: asyncio, pydantic. Must not touch: the engine, the wire formats (the caller hands
in the function that writes an error body).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Any]
Send = Callable[[Message], Any]
ASGIApp = Callable[[Scope, Receive, Send], Any]
ErrorBody = Callable[[int, str], dict[str, Any]]

INFERENCE_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses",
                             "/v1/messages", "/v1/embeddings"})


class FaultPatch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    fail_next: int | None = Field(default=None, ge=0)
    fail_status: int | None = Field(default=None, ge=400, le=599)
    hang: bool | None = None
    slow_factor: float | None = Field(default=None, gt=0)
    down: bool | None = None


class FaultState:
    """The current faults of one emulator (mutable, one per app)."""

    def __init__(self) -> None:
        self.fail_next = 0
        self.fail_status = 503
        self.slow_factor = 1.0
        self.down = False
        self._released = asyncio.Event()
        self._released.set()

    @property
    def hang(self) -> bool:
        return not self._released.is_set()

    def apply(self, patch: FaultPatch) -> None:
        for name in ("fail_next", "fail_status", "slow_factor", "down"):
            value = getattr(patch, name)
            if value is not None:
                setattr(self, name, value)
        if patch.hang is True:
            self._released.clear()
        elif patch.hang is False:
            self._released.set()

    def snapshot(self) -> dict[str, Any]:
        return {
            "fail_next": self.fail_next,
            "fail_status": self.fail_status,
            "hang": self.hang,
            "slow_factor": self.slow_factor,
            "down": self.down,
        }

    def take_failure(self) -> int | None:
        if self.fail_next <= 0:
            return None
        self.fail_next -= 1
        return self.fail_status

    async def wait_released(self) -> None:
        await self._released.wait()


class FaultMiddleware:
    """ASGI middleware applying ``down``, ``hang`` and ``fail_next`` before the routes."""

    def __init__(self, app: ASGIApp, faults: FaultState, error_body: ErrorBody) -> None:
        self.app, self.faults, self.error_body = app, faults, error_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].startswith("/emulator/"):
            await self.app(scope, receive, send)
            return
        if self.faults.down:
            await send_json(send, 503, self.error_body(503, "The emulated engine is down."))
            return
        if self.faults.hang:
            held = await self._hold(receive)
            if held is None:
                return  # the client left while we hung
            receive = held
        if scope["method"] == "POST" and scope["path"] in INFERENCE_PATHS:
            status = self.faults.take_failure()
            if status is not None:
                await send_json(send, status, self.error_body(status, "Injected failure."))
                return
        await self.app(scope, receive, send)

    async def _hold(self, receive: Receive) -> Receive | None:
        """Wait until released, buffering the request; None if the client disconnects."""
        buffered: list[Message] = []
        released = asyncio.ensure_future(self.faults.wait_released())
        try:
            while not released.done():
                incoming = asyncio.ensure_future(receive())
                await asyncio.wait({incoming, released}, return_when=asyncio.FIRST_COMPLETED)
                if not incoming.done():
                    incoming.cancel()
                    continue
                message = incoming.result()
                if message["type"] == "http.disconnect":
                    return None
                buffered.append(message)
        finally:
            released.cancel()

        async def replay() -> Message:
            return buffered.pop(0) if buffered else await receive()

        return replay


async def send_json(send: Send, status: int, body: dict[str, Any]) -> None:
    payload = orjson.dumps(body)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})
