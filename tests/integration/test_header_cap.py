"""Issue 24 item 2: request headers are capped while they arrive (``gateway/server.py``).

A real ``fleetgate serve`` process; clients on raw sockets send oversize header blocks. Each
gets a 431 in the OpenAI envelope and a closed connection, and the gateway's resident memory
(``VmRSS`` in ``/proc/PID/status``) does not grow with what they sent.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import orjson
import pytest

from procs import Proc, spawn_gateway

NO_ENGINE = {"pools": [{"name": "p", "accelerator": "h100", "engine": "vllm",
                        "price_per_gpu_hour": 2.0, "endpoints": ["http://127.0.0.1:9"],
                        "models": {"m": "m"}}]}


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    proc = spawn_gateway(NO_ENGINE, tmp_path_factory.mktemp("hdr"), wait_ready=False)
    yield proc
    proc.stop()


def _mib(pid: int, field: str) -> float:
    """``VmRSS`` (resident now) or ``VmHWM`` (the peak so far) of a process, in MiB."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(ln.split()[1] for ln in status.splitlines()
                    if ln.startswith(field + ":"))) / 1024


def _send_header(url: str, size: int, name: str = "x-big") -> bytes:
    """One request with a ``size``-byte header value on a raw socket; what came back."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        head = f"GET /healthz HTTP/1.1\r\nhost: {host}\r\n{name}: ".encode()
        try:
            sock.sendall(head)
            block = b"a" * (1024 * 1024)
            sent = 0
            while sent < size:
                sock.sendall(block[: size - sent])
                sent += min(len(block), size - sent)
            sock.sendall(b"\r\n\r\n")
        except OSError:  # the gateway stopped reading: what it said is still in the socket
            pass
        answer = b""
        try:
            while data := sock.recv(65536):
                answer += data
        except OSError:
            pass
        return answer


def _check_431(answer: bytes) -> None:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert b"connection: close" in head.lower()
    error = orjson.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "request_header_fields_too_large" and "64" in error["message"]


def test_a_1_mib_header_gets_a_431_envelope_and_a_closed_connection(gw: Proc) -> None:
    _check_431(_send_header(gw.url, 1024 * 1024))
    ok = httpx.get(gw.url + "/healthz", headers={"x-fine": "a" * 30_000})
    assert ok.status_code == 200  # a large but reasonable header still passes


def test_eight_32_mib_headers_leave_the_gateways_memory_where_it_was(gw: Proc) -> None:
    for _ in range(3):
        httpx.get(gw.url + "/healthz")
    before, peak_before = _mib(gw.popen.pid, "VmRSS"), _mib(gw.popen.pid, "VmHWM")
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: _send_header(gw.url, 32 * 1024 * 1024), range(8)))
    after, peak = _mib(gw.popen.pid, "VmRSS"), _mib(gw.popen.pid, "VmHWM")
    print(f"gateway RSS {before:.0f} MiB before, {after:.0f} MiB after 8 x 32 MiB headers "
          f"(peak {peak_before:.0f} -> {peak:.0f} MiB)")
    assert after - before < 20 and peak - peak_before < 20
    for answer in answers:
        _check_431(answer)
    assert httpx.get(gw.url + "/healthz").status_code == 200


def test_an_oversize_request_pipelined_behind_a_good_one_gets_its_431_after_it(gw: Proc) -> None:
    host, port = gw.url.removeprefix("http://").split(":")
    good = f"GET /healthz HTTP/1.1\r\nhost: {host}\r\n\r\n".encode()
    big = f"GET /healthz HTTP/1.1\r\nhost: {host}\r\nx-big: ".encode() + b"a" * 200_000
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(good + big)
        answer = b""
        while data := sock.recv(65536):
            answer += data
    first, _, rest = answer.partition(b'{"status":"ok"}')
    assert first.startswith(b"HTTP/1.1 200 ") and rest, answer[:300]
    _check_431(rest)


def _read_answer(sock: socket.socket, method: str = "GET") -> bytes:
    """One whole answer with a content-length from a keep-alive connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.lower().split(b"\r\n")
    length = 0 if method == "HEAD" else int(next(
        ln.split(b":")[1] for ln in lines if ln.startswith(b"content-length")))
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def test_answers_without_a_body_and_after_100_continue_keep_the_connection(gw: Proc) -> None:
    """Heads that wait for their body (``server._HeadWithBody``) never wait for one that
    does not come: HEAD, and a 100 Continue before the answer, on one connection."""
    host, port = gw.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(f"HEAD /healthz HTTP/1.1\r\nhost: {host}\r\n\r\n".encode())
        head = _read_answer(sock, "HEAD")  # a 405 with a content-length and no body
        assert head.startswith(b"HTTP/1.1 405 ") and head.endswith(b"\r\n\r\n")
        sock.sendall(f"GET /healthz HTTP/1.1\r\nhost: {host}\r\n\r\n".encode())
        assert _read_answer(sock).endswith(b'{"status":"ok"}')
        body = b'{"model":"nobody-serves-this","messages":[{"role":"user","content":"x"}]}'
        sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\n"
                     f"content-type: application/json\r\nexpect: 100-continue\r\n"
                     f"content-length: {len(body)}\r\n\r\n".encode())
        assert sock.recv(65536).startswith(b"HTTP/1.1 100 Continue")
        sock.sendall(body)
        answer = _read_answer(sock)
        assert answer.startswith(b"HTTP/1.1 404 ") and b"nobody-serves-this" in answer
