"""The naive pass-through of bench/overhead/run.py: FastAPI + one shared aiohttp session.

What a competent engineer writes in an afternoon: forward the body, return the bytes (JSON) or
relay the stream as it arrives. No routing, no metrics, no logging. ``NAIVE_UPSTREAM`` is the
engine's base URL. Run: ``NAIVE_UPSTREAM=http://127.0.0.1:8000 uvicorn naive:app --app-dir
bench/overhead --loop uvloop --http httptools --workers 1 --no-access-log``.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
from fastapi import FastAPI, Request, Response
from fastapi.responses import StreamingResponse

UPSTREAM = os.environ.get("NAIVE_UPSTREAM", "http://127.0.0.1:8000") + "/v1/chat/completions"
HEADERS = {"content-type": "application/json"}
session: aiohttp.ClientSession


@asynccontextmanager
async def lifespan(_: FastAPI) -> AsyncIterator[None]:
    global session
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    yield
    await session.close()


app = FastAPI(lifespan=lifespan)


@app.post("/v1/chat/completions")
async def chat(request: Request) -> Response:
    body = await request.body()
    upstream = await session.post(UPSTREAM, data=body, headers=HEADERS)
    if not json.loads(body).get("stream"):
        async with upstream:
            return Response(await upstream.read(), upstream.status, media_type="application/json")

    async def relay() -> AsyncIterator[bytes]:
        async with upstream:
            async for chunk in upstream.content.iter_any():
                yield chunk

    return StreamingResponse(relay(), upstream.status, media_type="text/event-stream")
