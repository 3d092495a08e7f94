"""A real Redis for the store tests: find one that answers, or start our own.

``test_redis_url()`` picks, in order: ``$FLEETGATE_TEST_REDIS_URL``; db 15 of the local Redis
at 127.0.0.1:6379 if it answers PING; else a ``redis-server`` child process on a free port
(no persistence), which the caller stops. ``RedisServer`` is also used directly by the
failure tests, which kill and restart their own server. Never fakeredis.

Tests isolate themselves with a unique key prefix (``unique_prefix()``), never FLUSHDB, so
parallel runs against one Redis do not collide; every key the stores write has a TTL.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from dataclasses import dataclass, field

import redis
import redis.asyncio as aioredis

from procs import free_port

LOCAL_URL = "redis://127.0.0.1:6379/15"


def answers(url: str, timeout_s: float = 0.5) -> bool:
    client = redis.Redis.from_url(url, socket_timeout=timeout_s,
                                  socket_connect_timeout=timeout_s)
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()


def unique_prefix() -> str:
    return f"fgtest:{uuid.uuid4().hex[:12]}:"


@dataclass
class RedisServer:
    """A ``redis-server`` child process on one port; ``start`` again reuses the port."""

    port: int = field(default_factory=free_port)
    popen: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not on PATH and no Redis answers")
        self.popen = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:  # bounded poll until it answers
            if self.popen.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.popen.returncode}")
            if answers(self.url, 0.2):
                return self
            time.sleep(0.02)
        self.kill()
        raise RuntimeError(f"redis-server on port {self.port} did not answer")

    def kill(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(timeout=5)


def find_test_redis() -> tuple[str, RedisServer | None]:
    """The URL to test against, and the server we started for it (None: someone else's)."""
    url = os.environ.get("FLEETGATE_TEST_REDIS_URL")
    if url:
        return url, None
    if answers(LOCAL_URL):
        return LOCAL_URL, None
    server = RedisServer().start()
    return server.url, server


async def wait_key_gone(client: aioredis.Redis, key: str, timeout_s: float = 3.0) -> None:
    """Bounded poll until Redis has expired ``key`` by itself (a short TTL the test set)."""
    import asyncio

    deadline = time.monotonic() + timeout_s
    while await client.exists(key):
        assert time.monotonic() < deadline, f"{key} did not expire"
        await asyncio.sleep(0.02)
