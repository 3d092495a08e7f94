"""Typed errors and their one mapping to the OpenAI error envelope.

Handlers raise ``GatewayError`` subclasses; ``error_response`` turns any of them into
``{"error": {"message", "type", "param", "code"}}`` with the right status. Upstream error
bodies in the engines' own shapes (vLLM nested, SGLang flat, ``{"error": "Unauthorized"}``)
are normalised by ``normalise_upstream_error``. A client never sees a stack trace or HTML.

May touch: starlette responses, orjson. Must not touch: routing or backends internals.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "upstream_timeout",
}


class GatewayError(Exception):
    status = 500
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.headers = headers or {}


class BadRequest(GatewayError):
    status = 400
    code = "invalid_request"


class ContextLengthExceeded(BadRequest):
    """The request fits the context of no endpoint serving the model (OpenAI's answer)."""

    code = "context_length_exceeded"


def context_length_exceeded(limit: int, prompt_tokens: int, completion_tokens: int | None,
                            param: str, cap_param: str | None = None) -> ContextLengthExceeded:
    """OpenAI's 400 for a request over the model's context; ``param`` names the prompt field
    ("messages", "prompt", "input"), ``completion_tokens`` None: the request set no output
    cap (or has no output). Token counts are the gateway's estimate (~4 characters a token).

    When the prompt alone fits and the output cap (``cap_param``, the field the request set)
    is what overflows, the error names the cap, in vLLM's words, as vLLM and SGLang do."""
    if completion_tokens is not None and cap_param and prompt_tokens < limit:
        return ContextLengthExceeded(
            f"'{cap_param}' is too large: {completion_tokens}. This model's maximum context "
            f"length is {limit} tokens and your request has about {prompt_tokens} input tokens "
            f"({completion_tokens} > {limit} - {prompt_tokens}).", param=cap_param)
    what = "the messages" if param == "messages" else f"the {param}"
    if completion_tokens is None:
        message = (f"This model's maximum context length is {limit} tokens. However, "
                   f"{'your messages' if param == 'messages' else f'your {param}'} resulted "
                   f"in {prompt_tokens} tokens. Please reduce the length of {what}.")
    else:
        message = (f"This model's maximum context length is {limit} tokens. However, you "
                   f"requested {prompt_tokens + completion_tokens} tokens ({prompt_tokens} in "
                   f"{what}, {completion_tokens} in the completion). Please reduce the length "
                   f"of {what} or completion.")
    return ContextLengthExceeded(message, param=param)


class Unauthorized(GatewayError):
    status = 401
    code = "invalid_api_key"


class Forbidden(GatewayError):
    status = 403
    code = "forbidden"


class RateLimited(GatewayError):
    status = 429
    code = "rate_limit_exceeded"


class NotFound(GatewayError):
    status = 404
    code = "model_not_found"


class RequestTimeout(GatewayError):
    """The request did not arrive in time (a body that never finishes)."""

    status = 408
    code = "request_timeout"

    def __init__(self, message: str) -> None:  # the rest may still come: no reuse
        super().__init__(message, headers={"connection": "close"})


class PayloadTooLarge(GatewayError):
    status = 413
    code = "request_too_large"


class UnsupportedMediaType(GatewayError):
    status = 415
    code = "unsupported_media_type"


class Overloaded(GatewayError):
    """Every endpoint is past its SLO capacity and this request is low priority: shed."""

    status = 429
    code = "overloaded"


class NoCapacity(GatewayError):
    """No endpoint can take the request (all down, breakers open, or every attempt failed)."""

    status = 503
    code = "no_healthy_upstream"


class UpstreamFailed(GatewayError):
    status = 502
    code = "upstream_error"


class UpstreamTimeout(GatewayError):
    status = 504
    code = "upstream_timeout"


def envelope(status: int, message: str, *, type_: str | None = None, param: str | None = None,
             code: str | int | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_ or _TYPES.get(status, "error"),
                      "param": param, "code": code}}


def error_response(exc: GatewayError, headers: dict[str, str] | None = None) -> Response:
    body = envelope(exc.status, exc.message, param=exc.param, code=exc.code)
    return json_error(exc.status, body, {**exc.headers, **(headers or {})})


def json_error(status: int, body: dict[str, Any],
               headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(body), status_code=status, headers=headers,
                    media_type="application/json")


def normalise_upstream_error(status: int, raw: bytes) -> dict[str, Any]:
    """An engine's error body, in whatever shape, as the OpenAI envelope."""
    try:
        obj = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        obj = None
    if isinstance(obj, dict):
        err = obj.get("error")
        if isinstance(err, dict) and "message" in err:  # vLLM / OpenAI nested
            return {"error": {"message": str(err.get("message")), "type": err.get("type"),
                              "param": err.get("param"), "code": err.get("code")}}
        if obj.get("object") == "error" and "message" in obj:  # SGLang flat
            return envelope(status, str(obj["message"]), type_=str(obj.get("type") or ""),
                            param=obj.get("param"), code=obj.get("code"))
        if isinstance(err, str):  # {"error": "Unauthorized"}
            return envelope(status, err)
    text = raw[:500].decode("utf-8", "replace").strip() if raw else ""
    return envelope(status, text or f"upstream answered HTTP {status}")
