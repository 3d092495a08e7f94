"""Relay rules: model rewriting, usage handling in streams, upstream error normalisation."""

from __future__ import annotations

import orjson
import pytest

from fleetgate.catalog.engines import translate_guided
from fleetgate.gateway.errors import normalise_upstream_error
from fleetgate.gateway.proxy.apis import APIS
from fleetgate.gateway.proxy.service import _model_rewriter
from fleetgate.gateway.proxy.stream import StreamRelay

SERVED = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.mark.parametrize(("data", "expected"), [
    (b'{"id":"x","model":"meta-llama/Llama-3.1-8B-Instruct","choices":[]}',
     b'{"id":"x","model":"llama-3.1-8b","choices":[]}'),
    (b'{"id": "x", "model": "meta-llama/Llama-3.1-8B-Instruct"}',
     b'{"id": "x", "model": "llama-3.1-8b"}'),
    (b'{"model":"other"}', b'{"model":"other"}'),
])
def test_model_rewriter(data: bytes, expected: bytes) -> None:
    assert _model_rewriter(SERVED, "llama-3.1-8b")(data) == expected


def test_model_rewriter_identity_when_names_match() -> None:
    data = b'{"model":"same"}'
    assert _model_rewriter("same", "same")(data) is data


class NoAttempt:
    """Stands in for the attempt: the relay only tells it when the first token came."""

    first_tokens = 0

    def first_token(self) -> None:
        self.first_tokens += 1


CONTENT = b'data: {"model":"m","choices":[{"delta":{"content":"hi"}}]}\n\n'
USAGE = (b'data: {"model":"m","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,'
         b'"total_tokens":5}}\n\n')
DONE = b"data: [DONE]\n\n"


@pytest.mark.parametrize(("wants", "expected"), [
    (True, CONTENT + USAGE + DONE),
    (False, CONTENT + DONE),
])
def test_stream_relay_usage(wants: bool, expected: bytes) -> None:
    relay = StreamRelay(APIS["chat"], wants, lambda d: d, NoAttempt())
    assert relay.transform([CONTENT, USAGE, DONE]) == expected
    assert relay.usage == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    assert relay.done


def test_stream_relay_keeps_comments() -> None:
    relay = StreamRelay(APIS["chat"], False, lambda d: d, NoAttempt())
    assert relay.transform([b": keep-alive\n\n", CONTENT]) == b": keep-alive\n\n" + CONTENT
    assert not relay.done


@pytest.mark.parametrize(("status", "raw", "message", "type_"), [
    (404, b'{"error":{"message":"The model `x` does not exist.","type":"NotFoundError",'
          b'"param":"model","code":404}}', "The model `x` does not exist.", "NotFoundError"),
    (400, b'{"object":"error","message":"The input (9000 tokens) is longer","type":'
          b'"BadRequestError","param":null,"code":400}', "The input (9000 tokens) is longer",
     "BadRequestError"),
    (401, b'{"error":"Unauthorized"}', "Unauthorized", "authentication_error"),
    (502, b"<html>bad gateway</html>", "<html>bad gateway</html>", "upstream_error"),
    (500, b"", "upstream answered HTTP 500", "internal_error"),
])
def test_normalise_upstream_error(status: int, raw: bytes, message: str, type_: str) -> None:
    err = normalise_upstream_error(status, raw)["error"]
    assert err["message"] == message and err["type"] == type_
    assert set(err) == {"message", "type", "param", "code"}


def test_translate_guided_fields_for_vllm() -> None:
    body = {"guided_json": {"type": "object"}, "guided_decoding_backend": "xgrammar", "x": 1}
    translate_guided(body)
    assert body == {"structured_outputs": {"json": {"type": "object"}}, "x": 1}
    assert orjson.dumps(body)
