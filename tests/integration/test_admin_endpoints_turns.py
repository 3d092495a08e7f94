"""``GET /admin/endpoints`` at thousands of endpoints leaves the event loop to the rest of the
gateway while it builds its rows (``api/admin.py``, ``ROWS_PER_TURN``): requests and the
collector's ticks run between chunks, and the answer is the whole list still."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import numpy as np

from fleetgate.gateway.api.admin import ROWS_PER_TURN, endpoint_rows
from fleetgate.gateway.api.openai import json_ok
from inproc import inproc_gateway

N = 2000
FLEET = {"pools": [{"name": f"p{k}", "accelerator": "h100", "engine": "vllm",
                    "price_per_gpu_hour": 2.0, "models": {"m": "m"},
                    "endpoints": [f"http://10.9.{k}.{i + 1}:8000" for i in range(N // 10)]}
                   for k in range(10)]}  # nothing listens there: rows without engines


async def test_rows_are_built_in_turns_and_the_list_stays_whole(tmp_path: Path) -> None:
    async with inproc_gateway(FLEET, tmp_path) as (url, state):
        turns = 0
        done = asyncio.Event()

        async def other_work() -> None:  # what else the event loop runs meanwhile
            nonlocal turns
            while not done.is_set():
                turns += 1
                await asyncio.sleep(0)

        other = asyncio.create_task(other_work())
        await asyncio.sleep(0)
        before = turns
        rows = await endpoint_rows(state, range(N))
        done.set()
        await other
        assert len(rows) == N
        assert turns - before >= N // ROWS_PER_TURN - 1  # a turn between every two chunks
        async with httpx.AsyncClient(timeout=60) as client:
            report = (await client.get(url + "/admin/endpoints")).json()
        assert report["total"] == N and len(report["endpoints"]) == N
        assert sum(p["endpoints"] for p in report["pools"]) == N


def test_numpy_numbers_in_an_admin_answer_are_json_numbers() -> None:
    body = json_ok({"a": np.float64(1.5), "b": np.int64(3), "c": float("nan")}).body
    assert body == b'{"a":1.5,"b":3,"c":null}'
