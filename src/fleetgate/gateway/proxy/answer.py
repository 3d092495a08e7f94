"""Is an engine's answer the API's? Whole (non-streamed) 200s checked, and the first-byte
deadline's message (issue 24 items 5 and 6).

- ``whole_answer``: a non-streamed 200 is relayed only when its body is a JSON object that
  holds the API's answer field (``choices`` for chat and completions, ``output`` for
  Responses, ``content`` for Messages, ``data`` for embeddings). Anything else (an HTML
  page from a proxy in front of the engine, ``{}``, garbage, a truncated body, a 200
  carrying only an ``error``) is a ``RetryableFailure`` 502 of this attempt: nothing has
  reached the client, so the next endpoint is tried, and with none left the client gets a
  502 envelope, as a streamed request gets for the same answer. The parse is the one the
  relay made anyway to read the usage; the client gets ``application/json`` whatever type
  the engine claimed.
- ``first_byte_timeout``: the policy's first-byte deadline passed. The message says what
  did arrive: nothing at all (no answer headers), or the headers and N bytes but no whole
  first frame (a stream) or no whole answer (a non-streamed request): a trickling engine is
  not a silent one.

May touch: orjson, the relay response's counters. Must not touch: routing, HTTP.
"""

from __future__ import annotations

from typing import Any

import orjson

from fleetgate.backends.relay import UpstreamResponse
from fleetgate.gateway.proxy.outcome import RetryableFailure

ANSWER_FIELD = {"chat": "choices", "completions": "choices", "responses": "output",
                "messages": "content", "embeddings": "data"}


def whole_answer(api: str, raw: bytes, endpoint: str, content_type: str) -> dict[str, Any]:
    """The parsed answer, or a ``RetryableFailure`` 502 when it is not the API's (module doc)."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        obj = None
    expected = ANSWER_FIELD.get(api, "choices")
    if isinstance(obj, dict) and expected in obj:
        return obj
    if isinstance(obj, dict) and isinstance(obj.get("error"), dict):
        what = f"an error: {str(obj['error'].get('message', ''))[:200]}"
    elif isinstance(obj, dict):
        what = f"JSON without {expected!r}" + (f" ({raw[:40]!r})" if len(raw) <= 40 else "")
    else:
        what = f"{len(raw)} bytes of {content_type or 'no content-type'} that are not JSON " \
               f"({raw[:40]!r})"
    raise RetryableFailure(502, f"{endpoint}: HTTP 200 but not the API's answer: {what}")


def first_byte_timeout(endpoint: str, limit: float | None, resp: UpstreamResponse | None,
                       stream: bool) -> RetryableFailure:
    """The failure for an attempt past its first-byte deadline (module doc)."""
    within = f"within {limit or 0:.1f} s"
    if resp is None:
        return RetryableFailure(504, f"{endpoint}: no answer headers {within} "
                                     "(hung engine?)")
    what = "first frame" if stream else "answer"
    return RetryableFailure(504, f"{endpoint}: the engine sent headers (HTTP {resp.status}) "
                                 f"and {resp.received} bytes but no complete {what} {within}")
