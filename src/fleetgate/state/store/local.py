"""One host's shared state without Redis: the ``serve --workers N`` supervisor serves its
in-memory stores to its worker processes over a Unix socket.

``LocalStoreServer`` holds a ``MemorySharedState`` and a ``MemoryLimits`` and answers calls
one at a time on its event loop, so each call is atomic across workers exactly as a Lua
script is in Redis: the limits stay exact however many workers take from them.
``LocalStore`` is the workers' side: both protocols (``SharedState`` and ``LimitStore``) over
one connection, calls pipelined, each answered by id. A call that gets no answer in
``timeout_s`` or finds the connection gone raises ``StoreUnavailable``, so ``create_stores``
wraps it in the same failover as Redis.

Wire: frames of a 4-byte big-endian length and a pickle: ``(id, method, args)`` in,
``(id, ok, result or error text)`` out. Pickle is safe here because only the supervisor's
own workers can connect: the socket lives in a directory only its user can enter (0700).

May touch: asyncio Unix sockets, pickle, the memory stores. Must not touch: routing, HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import pickle
import struct
from collections.abc import Mapping
from typing import Any

from fleetgate.state.store.base import EndpointShare, Registered, StoreUnavailable, Verdict
from fleetgate.state.store.memory import MemoryLimits, MemorySharedState

log = logging.getLogger("fleetgate")

_HEADER = struct.Struct(">I")
_MAX_FRAME = 64 * 1024 * 1024
SHARED_CALLS = frozenset({"publish", "peers", "put_registration", "drop_registration",
                          "registrations", "publish_blob", "blobs"})
LIMIT_CALLS = frozenset({"take", "record", "acquire", "release", "add_spend", "spent",
                         "reserve_spend"})


async def _read_frame(reader: asyncio.StreamReader) -> Any:
    (size,) = _HEADER.unpack(await reader.readexactly(_HEADER.size))
    if size > _MAX_FRAME:
        raise ConnectionError(f"frame of {size} bytes")
    return pickle.loads(await reader.readexactly(size))  # own workers only (module doc)


def _frame(obj: Any) -> bytes:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(data)) + data


class LocalStoreServer:
    """The supervisor's stores, served on ``path`` (module doc)."""

    def __init__(self, shared: MemorySharedState, limits: MemoryLimits) -> None:
        self._targets: dict[str, Any] = {**dict.fromkeys(SHARED_CALLS, shared),
                                         **dict.fromkeys(LIMIT_CALLS, limits)}
        self._server: asyncio.AbstractServer | None = None

    async def start(self, path: str) -> None:
        self._server = await asyncio.start_unix_server(self._serve, path)
        os.chmod(path, 0o600)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                call_id, method, args = await _read_frame(reader)
                target = self._targets.get(method)
                try:
                    if target is None:
                        raise ValueError(f"unknown store call {method!r}")
                    reply = (call_id, True, await getattr(target, method)(*args))
                except Exception as exc:  # the caller's error: answer it, keep serving
                    reply = (call_id, False, f"{type(exc).__name__}: {exc}")
                writer.write(_frame(reply))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the worker went away
        except Exception:
            log.exception("local store: a worker's connection failed")
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()


class LocalStore:
    """A worker's side: ``SharedState`` and ``LimitStore`` over the supervisor's socket."""

    def __init__(self, path: str, timeout_s: float = 0.25) -> None:
        self._path = path
        self._timeout_s = timeout_s
        self._ids = itertools.count()
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._connecting: asyncio.Lock | None = None

    async def _call(self, method: str, *args: Any) -> Any:
        writer = await self._connected()
        call_id = next(self._ids)
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[call_id] = answer
        try:
            writer.write(_frame((call_id, method, args)))
            ok, result = await asyncio.wait_for(answer, self._timeout_s)
        except (TimeoutError, ConnectionError, OSError) as exc:
            raise StoreUnavailable(f"local store: {method}: {type(exc).__name__} {exc}") from exc
        finally:
            self._pending.pop(call_id, None)
        if not ok:
            raise StoreUnavailable(f"local store: {method}: {result}")
        return result

    async def _connected(self) -> asyncio.StreamWriter:
        self._connecting = self._connecting or asyncio.Lock()
        async with self._connecting:
            if self._writer is not None and not self._writer.is_closing():
                return self._writer
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_unix_connection(self._path), self._timeout_s)
            except (TimeoutError, OSError) as exc:
                raise StoreUnavailable(f"local store at {self._path}: {exc}") from exc
            self._writer = writer
            self._reader_task = asyncio.create_task(self._read(reader),
                                                    name="fleetgate-local-store")
            return writer

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                call_id, ok, result = await _read_frame(reader)
                answer = self._pending.get(call_id)
                if answer is not None and not answer.done():
                    answer.set_result((ok, result))
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            if self._writer is not None:
                self._writer.close()
            for answer in self._pending.values():
                if not answer.done():
                    answer.set_exception(ConnectionError("the supervisor's store went away"))

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._reader_task is not None:
            self._reader_task.cancel()
            await asyncio.gather(self._reader_task, return_exceptions=True)

    # -- SharedState ---------------------------------------------------------------------
    async def publish(self, replica_id: str, shares: Mapping[str, EndpointShare],
                      ttl_s: float) -> None:
        await self._call("publish", replica_id, dict(shares), ttl_s)

    async def peers(self, replica_id: str) -> dict[str, dict[str, EndpointShare]]:
        result: dict[str, dict[str, EndpointShare]] = await self._call("peers", replica_id)
        return result

    async def put_registration(self, key: str, record: bytes, ttl_s: float,
                               now: float) -> None:
        await self._call("put_registration", key, record, ttl_s, now)

    async def drop_registration(self, key: str) -> None:
        await self._call("drop_registration", key)

    async def registrations(self) -> list[Registered]:
        result: list[Registered] = await self._call("registrations")
        return result

    async def publish_blob(self, kind: str, replica_id: str, blob: bytes,
                           ttl_s: float) -> None:
        await self._call("publish_blob", kind, replica_id, blob, ttl_s)

    async def blobs(self, kind: str) -> dict[str, bytes]:
        result: dict[str, bytes] = await self._call("blobs", kind)
        return result

    # -- LimitStore ----------------------------------------------------------------------
    async def take(self, key: str, amount: float, limit: float, window_s: float,
                   now: float) -> Verdict:
        result: Verdict = await self._call("take", key, amount, limit, window_s, now)
        return result

    async def record(self, key: str, amount: float, window_s: float, now: float,
                     replaces: str | None = None) -> None:
        await self._call("record", key, amount, window_s, now, replaces)

    async def acquire(self, key: str, limit: int, ttl_s: float, now: float) -> str | None:
        result: str | None = await self._call("acquire", key, limit, ttl_s, now)
        return result

    async def release(self, key: str, hold_id: str) -> None:
        await self._call("release", key, hold_id)

    async def add_spend(self, key: str, usd: float, period_key: str, ttl_s: float,
                        settles: str | None = None) -> float:
        result: float = await self._call("add_spend", key, usd, period_key, ttl_s, settles)
        return result

    async def reserve_spend(self, key: str, usd: float, period_key: str, cap: float,
                            ttl_s: float, now: float) -> str | None:
        result: str | None = await self._call("reserve_spend", key, usd, period_key, cap,
                                              ttl_s, now)
        return result

    async def spent(self, key: str, period_key: str) -> float:
        result: float = await self._call("spent", key, period_key)
        return result
