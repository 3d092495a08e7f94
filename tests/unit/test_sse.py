"""Table-driven tests of fleetgate.backends.sse over the recorded engine streams."""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest

from fleetgate.backends.sse import (
    DONE,
    DONE_FRAME,
    MAX_FRAME_BYTES,
    FrameTooLarge,
    SSEFramer,
    checked,
    chunk_usage,
    frame_data,
    is_usage_only_chunk,
    stream_error,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for engine_contract
from engine_contract import (
    HEX16,
    HEX32,
    assert_sglang_chat_stream_shape,
    assert_sglang_error_body,
    assert_stream_error_frame,
    assert_vllm_chat_stream_shape,
    assert_vllm_completion_stream_shape,
    assert_vllm_error_body,
    load_fixture,
    split_frames,
)

ANSWER = "The capital of France is Paris."
USAGE_CHAT = {"prompt_tokens": 48, "completion_tokens": 8, "total_tokens": 56}


@dataclass(frozen=True)
class Stream:
    """What each recorded stream must yield, frame by frame."""

    fixture: str
    frames: int  # including comments and [DONE]
    comments: int = 0
    usage: dict[str, int] | None = None  # the usage chunk's counts
    error: tuple[int, str, str] | None = None  # status, type, message of the in-band error
    usage_only_frames: tuple[int, ...] = ()  # indices of the separate usage chunk(s)
    extra: dict[str, Any] = field(default_factory=dict)


STREAMS = [
    Stream("vllm_chat_stream.txt", 11, usage=USAGE_CHAT, usage_only_frames=(9,)),
    Stream("vllm_chat_stream_no_usage.txt", 10),
    Stream(
        "vllm_chat_stream_keepalive_crlf.txt",
        14,
        comments=3,
        usage=USAGE_CHAT,
        usage_only_frames=(12,),
    ),
    Stream(
        "vllm_completion_stream.txt",
        12,
        usage={"prompt_tokens": 7, "completion_tokens": 10, "total_tokens": 17},
        usage_only_frames=(10,),
    ),
    Stream(
        "vllm_stream_midstream_error.txt",
        6,
        error=(500, "InternalServerError", "Internal server error"),
    ),
    Stream("sglang_chat_stream.txt", 11, usage=USAGE_CHAT, usage_only_frames=(9,)),
    Stream("sglang_chat_stream_sglext.txt", 12, usage=USAGE_CHAT, usage_only_frames=(10,)),
    Stream(
        "sglang_queue_full_stream.txt",
        2,
        error=(503, "SERVICE_UNAVAILABLE", "The request queue is full."),
    ),
    Stream(
        "sglang_queue_full_stream_usage.txt",
        3,
        usage={"prompt_tokens": 48, "completion_tokens": 0, "total_tokens": 48},
        error=(503, "SERVICE_UNAVAILABLE", "The request queue is full."),
        usage_only_frames=(1,),
    ),
]
IDS = [s.fixture.removesuffix(".txt") for s in STREAMS]


def lf(raw: bytes) -> bytes:
    return raw.replace(b"\r\n", b"\n")


def feed_all(raw: bytes, sizes: list[int]) -> tuple[list[bytes], bytes]:
    framer = SSEFramer()
    frames: list[bytes] = []
    pos = 0
    for size in sizes:
        frames += framer.feed(raw[pos : pos + size])
        pos += size
    frames += framer.feed(raw[pos:])
    return frames, framer.tail()


def random_sizes(raw: bytes, seed: int) -> list[int]:
    rng = random.Random(seed)
    sizes, total = [], 0
    while total < len(raw):
        sizes.append(rng.choice([1, 2, 3, 7, 64, 200, 1000]))
        total += sizes[-1]
    return sizes


@pytest.mark.parametrize("stream", STREAMS, ids=IDS)
def test_whole_body_splits_into_expected_frames(stream: Stream) -> None:
    raw = load_fixture(stream.fixture)
    frames = split_frames(raw)
    assert len(frames) == stream.frames
    assert b"".join(frames) == lf(raw), "frames must cover the body exactly (after CRLF)"
    assert all(f.endswith(b"\n\n") for f in frames)
    assert frames[-1] == DONE_FRAME
    assert sum(frame_data(f) is None for f in frames) == stream.comments


@pytest.mark.parametrize("stream", STREAMS, ids=IDS)
@pytest.mark.parametrize(
    "chunking", ["byte-by-byte", "seed-1", "seed-2", "seed-3", "halves"], ids=str
)
def test_chunking_does_not_change_frames(stream: Stream, chunking: str) -> None:
    raw = load_fixture(stream.fixture)
    if chunking == "byte-by-byte":
        sizes = [1] * len(raw)
    elif chunking == "halves":
        sizes = [len(raw) // 2]
    else:
        sizes = random_sizes(raw, int(chunking.split("-")[1]))
    frames, tail = feed_all(raw, sizes)
    assert frames == split_frames(raw)
    assert tail == b""


def test_crlf_split_at_every_offset() -> None:
    raw = load_fixture("vllm_chat_stream_keepalive_crlf.txt")
    assert b"\r\n" in raw, "fixture lost its CRLF line endings (git normalization?)"
    want = split_frames(lf(raw))
    for cut in range(1, len(raw)):
        frames, tail = feed_all(raw, [cut])
        assert frames == want, f"cut at {cut}"
        assert tail == b""


def test_crlf_fixture_carries_same_data_as_lf_fixture() -> None:
    crlf = [
        frame_data(f) for f in split_frames(load_fixture("vllm_chat_stream_keepalive_crlf.txt"))
    ]
    plain = [frame_data(f) for f in split_frames(load_fixture("vllm_chat_stream.txt"))]
    assert [d for d in crlf if d is not None] == plain


@pytest.mark.parametrize("stream", STREAMS, ids=IDS)
def test_truncated_stream_leaves_a_tail(stream: Stream) -> None:
    raw = lf(load_fixture(stream.fixture))
    cut = len(raw) - len(DONE_FRAME) - 5  # inside the frame before [DONE]
    frames, tail = feed_all(raw[:cut], [cut])
    assert tail and raw.startswith(b"".join(frames) + tail)
    assert DONE_FRAME not in frames


@pytest.mark.parametrize("stream", STREAMS, ids=IDS)
def test_frame_data_and_done(stream: Stream) -> None:
    frames = split_frames(load_fixture(stream.fixture))
    datas = [frame_data(f) for f in frames]
    assert datas[-1] == DONE and datas.count(DONE) == 1
    for data in datas[:-1]:
        if data is not None:
            assert isinstance(orjson.loads(data), dict)


@pytest.mark.parametrize("stream", STREAMS, ids=IDS)
def test_stream_error_only_on_the_error_frame(stream: Stream) -> None:
    datas = [d for f in split_frames(load_fixture(stream.fixture)) if (d := frame_data(f))]
    errors = [(i, e) for i, d in enumerate(datas) if (e := stream_error(d)) is not None]
    if stream.error is None:
        assert errors == []
        return
    assert len(errors) == 1
    _, err = errors[0]
    assert (err.status, err.type, err.message) == stream.error
    assert err.body["code"] == stream.error[0]


@pytest.mark.parametrize("stream", STREAMS, ids=IDS)
def test_chunk_usage_extraction(stream: Stream) -> None:
    datas = [d for f in split_frames(load_fixture(stream.fixture)) if (d := frame_data(f))]
    usages = [(i, u) for i, d in enumerate(datas) if (u := chunk_usage(d)) is not None]
    if stream.usage is None:
        assert usages == []
        return
    assert len(usages) == 1, "exactly one chunk carries usage"
    index, usage = usages[0]
    assert {k: usage[k] for k in stream.usage} == stream.usage
    assert index == len(datas) - 2, "the usage chunk comes right before [DONE]"


# SGLang's sglext chunk ('"choices":[],"usage":null,"sglext":{...}') is not a usage chunk.
USAGE_ONLY_CASES = [pytest.param(s, id=i) for s, i in zip(STREAMS, IDS, strict=True)]


@pytest.mark.parametrize("stream", USAGE_ONLY_CASES)
def test_is_usage_only_chunk(stream: Stream) -> None:
    datas = [frame_data(f) for f in split_frames(load_fixture(stream.fixture))]
    flagged = tuple(
        i for i, d in enumerate(datas) if d is not None and d != DONE and is_usage_only_chunk(d)
    )
    assert flagged == stream.usage_only_frames


def test_is_usage_only_chunk_ignores_usage_null() -> None:
    datas = [frame_data(f) for f in split_frames(load_fixture("sglang_chat_stream_sglext.txt"))]
    sglext = next(d for d in datas if d is not None and b'"sglext"' in d)
    assert b'"usage":null' in sglext and chunk_usage(sglext) is None
    assert not is_usage_only_chunk(sglext)


# --- the contract helpers over the fixtures ("one conformance suite, two targets") ---


@pytest.mark.parametrize(
    ("fixture", "include_usage", "comments"),
    [
        ("vllm_chat_stream.txt", True, 0),
        ("vllm_chat_stream_no_usage.txt", False, 0),
        ("vllm_chat_stream_keepalive_crlf.txt", True, 3),
    ],
)
def test_vllm_chat_contract(fixture: str, include_usage: bool, comments: int) -> None:
    summary = assert_vllm_chat_stream_shape(
        split_frames(load_fixture(fixture)), include_usage=include_usage
    )
    assert summary.text == ANSWER and summary.finish_reason == "stop"
    assert summary.usage == (USAGE_CHAT if include_usage else None)
    assert summary.comments == comments
    assert HEX16.fullmatch(summary.id.removeprefix("chatcmpl-"))
    assert summary.model == "meta-llama/Llama-3.1-8B-Instruct"


@pytest.mark.parametrize("fixture", ["sglang_chat_stream.txt", "sglang_chat_stream_sglext.txt"])
def test_sglang_chat_contract(fixture: str) -> None:
    summary = assert_sglang_chat_stream_shape(
        split_frames(load_fixture(fixture)), include_usage=True
    )
    assert summary.text == ANSWER and summary.finish_reason == "stop"
    assert summary.usage is not None
    assert {k: summary.usage[k] for k in USAGE_CHAT} == USAGE_CHAT
    assert HEX32.fullmatch(summary.id)


def test_sglang_finish_chunk_matched_stop() -> None:
    datas = [frame_data(f) for f in split_frames(load_fixture("sglang_chat_stream.txt"))]
    finish = orjson.loads(next(d for d in datas if d and b'"finish_reason":"stop"' in d))
    assert finish["choices"][0]["matched_stop"] == 128009


def test_vllm_completion_contract() -> None:
    summary = assert_vllm_completion_stream_shape(
        split_frames(load_fixture("vllm_completion_stream.txt")), include_usage=True
    )
    assert summary.finish_reason == "length"
    assert summary.text == " Paris. It is known for the Eiffel Tower."


@pytest.mark.parametrize(
    ("fixture", "code", "flavour"),
    [
        ("vllm_stream_midstream_error.txt", 500, "vllm"),
        ("sglang_queue_full_stream.txt", 503, "sglang"),
        ("sglang_queue_full_stream_usage.txt", 503, "sglang"),
    ],
)
def test_stream_error_contract(fixture: str, code: int, flavour: str) -> None:
    err = assert_stream_error_frame(split_frames(load_fixture(fixture)), code=code, flavour=flavour)
    assert err["param"] is None


def test_contract_rejects_a_stream_without_done() -> None:
    frames = split_frames(load_fixture("vllm_chat_stream.txt"))[:-1]
    with pytest.raises(AssertionError, match="DONE"):
        assert_vllm_chat_stream_shape(frames, include_usage=True)


def test_contract_tells_the_flavours_apart() -> None:
    with pytest.raises(AssertionError):
        assert_vllm_chat_stream_shape(
            split_frames(load_fixture("sglang_chat_stream.txt")), include_usage=True
        )
    with pytest.raises(AssertionError):
        assert_sglang_chat_stream_shape(
            split_frames(load_fixture("vllm_chat_stream.txt")), include_usage=True
        )


@pytest.mark.parametrize(
    ("fixture", "status", "flavour"),
    [
        ("vllm_error_404.json", 404, "vllm"),
        ("vllm_error_400_context.json", 400, "vllm"),
        ("vllm_error_401.json", 401, "vllm"),
        ("sglang_error_400.json", 400, "sglang"),
        ("sglang_error_503.json", 503, "sglang"),
    ],
)
def test_error_body_contract(fixture: str, status: int, flavour: str) -> None:
    check = assert_vllm_error_body if flavour == "vllm" else assert_sglang_error_body
    err = check(load_fixture(fixture), status=status)
    assert err["message"]
    if fixture == "sglang_error_503.json":
        assert err["type"] == "503"


# --- edge cases of the framing not covered by the engines' own output ---


@pytest.mark.parametrize(
    ("frame", "data"),
    [
        (b"data: x\n\n", b"x"),
        (b"data:x\n\n", b"x"),
        (b"data:  x\n\n", b" x"),
        (b"data: a\ndata: b\n\n", b"a\nb"),
        (b": keep-alive\n\n", None),
        (b"event: sglext_ids\ndata: {}\n\n", b"{}"),
        (b"id: 7\n\n", None),
        (b"\ndata: x\n\n", b"x"),
    ],
)
def test_frame_data_edge_cases(frame: bytes, data: bytes | None) -> None:
    assert frame_data(frame) == data


def test_extra_blank_lines_between_frames() -> None:
    frames = SSEFramer().feed(b"data: a\n\n\ndata: b\n\n")
    assert [frame_data(f) for f in frames] == [b"a", b"b"]


@pytest.mark.parametrize(
    "data",
    [
        b'{"error": {"message": "m", "type": "t", "param": null, "code": 503}}',
        b'{ "error": {"message": "m", "type": "t", "code": 503}}',
    ],
)
def test_stream_error_whitespace_variants(data: bytes) -> None:
    err = stream_error(data)
    assert err is not None and err.status == 503


@pytest.mark.parametrize(
    ("data", "status"),
    [
        (b'{"error":{"message":"m","type":"t","code":"model_not_found"}}', 500),
        (b'{"error":{"message":"m","type":"t","code":200}}', 500),
        (b'{"error":{"message":"m","type":"t"}}', 500),
        (b'{"error":{"message":"m","type":"t","code":429}}', 429),
    ],
)
def test_stream_error_status_fallback(data: bytes, status: int) -> None:
    err = stream_error(data)
    assert err is not None and err.status == status


@pytest.mark.parametrize(
    "data",
    [
        b'{"error":"Unauthorized"}',  # a body, not a frame: no error object
        b'{"error": not json',
        b'{"id":"x","choices":[{"delta":{"content":"\\"error\\": no"}}]}',
    ],
)
def test_stream_error_none(data: bytes) -> None:
    assert stream_error(data) is None


def test_chunk_usage_continuous_and_null() -> None:
    assert chunk_usage(b'{"choices":[{"delta":{}}],"usage":{"prompt_tokens":1}}') == {
        "prompt_tokens": 1
    }
    assert chunk_usage(b'{"choices":[],"usage":null}') is None
    assert chunk_usage(b'{"choices":[], "usage": null}') is None
    assert chunk_usage(b'{"choices":[{"delta":{"content":"\\"usage\\""}}]}') is None


# -- issue 24: what is not SSE, and frames too large --------------------------------------
@pytest.mark.parametrize(("frame", "relayed", "data"), [
    (b'data: {"a":1}\n\n', b'data: {"a":1}\n\n', b'{"a":1}'),
    (b"data: [DONE]\n\n", b"data: [DONE]\n\n", b"[DONE]"),
    (b": keep-alive\n\n", b": keep-alive\n\n", None),
    (b'event: x\ndata: {"a":1}\n\n', b'event: x\ndata: {"a":1}\n\n', b'{"a":1}'),
    (b"data: {broken json\n\n", None, None),
    (b"\x00\xff\xfe binary garbage\n\n", None, None),
    (b"<html>not sse</html>\n\n", None, None),
    (b'garbage line\ndata: {"a":1}\n\n', b'data: {"a":1}\n\n', b'{"a":1}'),
    (b"event: x\ndata: {broken\n\n", b"event: x\n\n", None),
    (b'data: {"a":\ndata: 1}\n\n', b'data: {"a":\ndata: 1}\n\n', b'{"a":\n1}'),
])
def test_checked_keeps_sse_and_drops_the_rest(frame: bytes, relayed: bytes | None,
                                              data: bytes | None) -> None:
    got = checked(frame)
    if relayed is None:
        assert got is None
    else:
        assert got == (relayed, data)


def test_a_frame_past_the_cap_raises_and_a_long_one_is_joined_once() -> None:
    framer = SSEFramer()
    assert framer.feed(b'data: {"x":"' + b"a" * 100_000) == []  # past _LONG: kept in pieces
    for _ in range(10):
        assert framer.feed(b"a" * 100_000) == []
    assert framer.feed(b'"}\r') == []
    frames = framer.feed(b"\n\r\ndata: [DONE]\n\n")  # the end split across two pieces
    assert len(frames) == 2 and frames[0].endswith(b'"}\n\n') and len(frames[0]) > 1_100_000
    assert frames[1] == DONE_FRAME and framer.tail() == b""
    huge = SSEFramer()
    with pytest.raises(FrameTooLarge) as caught:
        for _ in range(MAX_FRAME_BYTES // 65536 + 2):
            huge.feed(b"a" * 65536)
    assert caught.value.kind == "protocol" and "8 MiB" in str(caught.value)
