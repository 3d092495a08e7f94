"""Issue 24: a real ``fleetgate serve`` in front of a hostile engine (``tests/hostile_engine.py``).

Every mode is asked four ways (the official ``openai`` client and raw httpx, streamed and
not, at once); each must end in a well-formed answer or a clear OpenAI-shaped error: a 5xx
envelope before the first byte, or a 200 stream that ends with the API's error event and
``[DONE]``. Never a hang (every client has a deadline), a 500, a dropped connection or
bytes that are not the API's. The gateway runs with short upstream timeouts (read 2 s,
total 8 s, first byte 1.5 s) so the slow modes end quickly; the huge frame checks that the
gateway's peak memory (``VmHWM`` of its process) stays bounded.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest

from hostile_engine import MODES, HostileEngine
from procs import Proc, spawn_gateway

READ_S, TOTAL_S, FIRST_BYTE_MS = 2, 8, 1500
MESSAGES = [{"role": "user", "content": "hello"}]

# mode -> (streamed outcome, non-streamed outcome): "ok", "event" (a 200 stream ending
# with the error event), "cut" (a 200 stream the gateway ended: the error event, or a
# finish_reason "length" once the engine passed max_tokens), or the error envelope's status
EXPECTED: dict[str, tuple[str | int, str | int]] = {
    "ok": ("ok", "ok"), "html": (502, 502), "empty_json": (502, 502), "gzip": ("ok", "ok"),
    "garbage": ("ok", 502), "broken_json": ("ok", 502), "slow_headers": (504, 504),
    "trickle": (504, 504), "endless": ("cut", 504), "stall": ("event", 504),
    "huge_frame": ("event", None), "wrong_ct": ("ok", "ok"),  # type: ignore[dict-item]
}
assert set(EXPECTED) == set(MODES)


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[HostileEngine, Proc]]:
    with HostileEngine() as engine:
        config = {
            "pools": [{"name": f"p-{mode}", "accelerator": "h100", "engine": "vllm",
                       "price_per_gpu_hour": 2.0, "endpoints": [engine.endpoint(mode)],
                       "models": {mode: f"hostile-{mode}"}} for mode in MODES],
            "policies": {"main": {"strategy": "latency",
                                  "first_byte_timeout_ms": FIRST_BYTE_MS}},
            "default_policy": "main",
        }
        gw = spawn_gateway(config, tmp_path_factory.mktemp("hostile"), env={
            "FLEETGATE_READ_TIMEOUT_S": str(READ_S),
            "FLEETGATE_TOTAL_TIMEOUT_S": str(TOTAL_S)})
        try:
            yield engine, gw
        finally:
            gw.stop()


def _envelope(status: int, body: bytes) -> dict[str, Any]:
    obj = orjson.loads(body)
    assert set(obj) == {"error"} and {"message", "type", "param", "code"} <= set(obj["error"])
    assert obj["error"]["message"]
    return dict(obj["error"])


def _check_frames(text: str, expected: str | int) -> str:
    """Every event of a relayed stream is the API's JSON; returns the content relayed."""
    assert text.endswith("data: [DONE]\n\n"), text[-300:]
    content, errors, finish = "", [], None
    for frame in text.split("\n\n")[:-1]:
        assert frame.startswith("data: "), repr(frame[:100])
        data = frame[6:]
        if data == "[DONE]":
            continue
        obj = orjson.loads(data)
        if "error" in obj:
            errors.append(obj["error"])
            continue
        for choice in obj.get("choices", []):
            content += choice["delta"].get("content") or ""
            finish = choice.get("finish_reason") or finish
    if expected == "ok":
        assert not errors and content == "hi there", (errors, content)
    elif expected == "cut":
        assert errors or finish == "length", text[-300:]
    else:
        assert errors and errors[0]["message"], text[-300:]
    return content


def _raw(gw: Proc, mode: str, stream: bool, expected: str | int) -> str:
    body = {"model": mode, "messages": MESSAGES, "max_tokens": 5, "stream": stream}
    with httpx.Client(timeout=30) as client:
        resp = client.post(gw.url + "/v1/chat/completions", json=body)
    assert "content-encoding" not in resp.headers
    if expected in ("ok", "event", "cut"):
        assert resp.status_code == 200, resp.text[:300]
        if stream:
            assert resp.headers["content-type"].startswith("text/event-stream")
            _check_frames(resp.text, expected)
        else:
            assert resp.headers["content-type"] == "application/json"
            assert resp.json()["choices"][0]["message"]["content"] == "hi there"
        return ""
    assert resp.status_code == expected, resp.text[:300]
    return str(_envelope(resp.status_code, resp.content)["message"])


def _sdk(gw: Proc, mode: str, stream: bool, expected: str | int) -> str:
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0, timeout=30)
    try:
        if stream:
            events = client.chat.completions.create(model=mode, messages=MESSAGES,
                                                    max_tokens=5, stream=True)
            text = "".join(c.choices[0].delta.content or "" for c in events if c.choices)
        else:
            answer = client.chat.completions.create(model=mode, messages=MESSAGES,
                                                    max_tokens=5)
            text = answer.choices[0].message.content or ""
    except openai.APIStatusError as exc:
        assert exc.status_code == expected, exc
        return str(exc.message)
    except openai.APIError as exc:  # the error event of a stream already begun
        assert expected in ("event", "cut") and stream, exc
        assert exc.message, exc
        return str(exc.message)
    assert (expected == "ok" and text == "hi there") or expected == "cut", (expected, text)
    return ""


@pytest.mark.parametrize("mode", [m for m in MODES if m != "huge_frame"])
def test_a_hostile_answer_ends_in_an_answer_or_a_clear_error(
        hostile: tuple[HostileEngine, Proc], mode: str) -> None:
    _engine, gw = hostile
    streamed, whole = EXPECTED[mode]
    runs = [(check, stream, outcome) for check in (_raw, _sdk)
            for stream, outcome in ((True, streamed), (False, whole))]
    with ThreadPoolExecutor(len(runs)) as pool:
        messages = list(pool.map(lambda run: run[0](gw, mode, run[1], run[2]), runs))
    if mode == "trickle":  # issue 24 item 6: say what came, not "no first byte"
        for message in messages:
            assert "no first byte" not in message and "bytes" in message, message
    if mode == "slow_headers":
        assert all("headers" in m for m in messages), messages


def test_the_gateway_asks_engines_for_uncompressed_answers(
        hostile: tuple[HostileEngine, Proc]) -> None:
    engine, gw = hostile
    _raw(gw, "ok", False, "ok")
    headers = [h for path, h in engine.requests if path.startswith("/m/ok/")][-1]
    assert headers.get("accept-encoding") == "identity"


def _peak_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("VmHWM:")))


def test_a_64_mib_frame_ends_the_stream_and_memory_stays_bounded(
        hostile: tuple[HostileEngine, Proc]) -> None:
    _engine, gw = hostile
    before = _peak_kib(gw.popen.pid)
    _raw(gw, "huge_frame", True, "event")
    message = _sdk(gw, "huge_frame", True, "event")
    grown_mib = (_peak_kib(gw.popen.pid) - before) / 1024
    print(f"gateway peak RSS grew {grown_mib:.1f} MiB over two 64 MiB frames; {message}")
    assert "frame" in message
    assert grown_mib < 40
