"""A client that leaves before its answer, through a real gateway (``fleetgate serve``).

Under the gateway's own server the request's ``ClientWatch`` is no task: the server's
protocol calls its hook when the connection is lost (``gateway/server.py``,
``proxy/client.py``). These check that the hook still ends the attempt at once, so the
engine aborts the request, for a whole (non-streamed) answer and before a stream's first
byte is read by the client.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from procs import PUBLIC_8B, SERVED_8B, pool, spawn_emulator, spawn_gateway, wait_for


@pytest.mark.parametrize("stream", [False, True])
def test_client_leaving_before_the_answer_aborts_upstream(tmp_path: Path, stream: bool) -> None:
    engine = spawn_emulator("vllm", "h100", [SERVED_8B], speed=1.0)
    gw = spawn_gateway({"pools": [pool("h100-vllm", "h100", "vllm", 2.95, [engine.url],
                                       {PUBLIC_8B: SERVED_8B})]}, tmp_path)
    try:
        body = json.dumps({"model": PUBLIC_8B, "max_tokens": 4000, "stream": stream,
                           "messages": [{"role": "user", "content": "hello"}]}).encode()
        url = urlsplit(gw.url)
        sock = socket.create_connection((url.hostname, url.port))
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\n"
                     b"content-type: application/json\r\ncontent-length: "
                     + str(len(body)).encode() + b"\r\n\r\n" + body)
        wait_for(lambda: httpx.get(engine.url + "/emulator/state").json()["running"] == 1,
                 timeout=10, what="the engine to start the request")
        sock.close()  # before the answer (a long generation): nobody will read it
        wait_for(lambda: httpx.get(engine.url + "/emulator/state").json()["running"] == 0,
                 timeout=5, what="the engine to drop the abandoned request")
        ok = httpx.post(gw.url + "/v1/chat/completions", timeout=30, json={
            "model": PUBLIC_8B, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
        assert ok.status_code == 200  # the gateway serves on
    finally:
        gw.stop()
        engine.stop()
