"""``POST /v1/embeddings`` as vLLM 0.33 (pooling runner) and SGLang 0.5.23 serve it.

Each input is one engine request (a prefill plus one pooling step, ``pooling=True``: no output
token in the metrics), run through the same engine loop as generation, so latency, queueing
and ``/metrics`` stay honest. The vector is a deterministic unit vector: SHA-256 of the model
name and the input in counter mode, mapped to [-1, 1), L2-normalised as float32; dimension =
the model profile's ``d_model`` (4096 for the 8B profile), or ``dimensions`` when the request
asks for fewer (the emulated model is matryoshka-capable). Same input -> same vector.

Wire facts (research notes; fixtures tests/data/{vllm,sglang}_embeddings*.json):

* vLLM (pooling/embed/protocol.py:174-186, embed/serving.py:97-153): ``{"id": "embd-<16 hex>",
  "object": "list", "created", "model": <first served name>, "data": [{"index", "object":
  "embedding", "embedding"}], "usage": {prompt_tokens, total_tokens, completion_tokens: 0,
  prompt_tokens_details: null, completion_tokens_details: null}}``, floats written from the
  float32 array (shortest float32 form); a generative vLLM server has no such route: 404
  ``{"detail": "Not Found"}``;
* SGLang (serving_embedding.py, protocol.py:1438-1480): ``{"data": [{"embedding", "index",
  "object"}], "model": <model path>, "object": "list", "usage": {..., "reasoning_tokens": 0,
  ...}}`` (no id, no created), floats as Python doubles of the float32 values; on a
  generative model a flat 400 "This model does not appear to be an embedding model...";
* ``encoding_format`` ``base64``: little-endian float32 bytes, base64 (both).

May touch: numpy, orjson, parsing.py. Must not touch: I/O, the engine (the server submits).
"""

from __future__ import annotations

import base64
import hashlib
import math
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from fleetgate.emulator.parsing import EngineError, EngineLimits, ParsedRequest, text_tokens

NOT_AN_EMBEDDING_MODEL = (
    "This model does not appear to be an embedding model by default. Please add "
    "`--is-embedding` when launching the server or try another model."
)


@dataclass(frozen=True)
class EmbeddingJob:
    """The embeddings one request asks for, and how its answer is written."""

    engine: str
    requests: tuple[ParsedRequest, ...]  # one engine request per input
    inputs: tuple[str, ...]  # what each vector is derived from
    dim: int
    encoding: str
    model: str
    created: int

    def body(self) -> bytes:
        vectors = [unit_vector(f"{self.model}|{text}", self.dim) for text in self.inputs]
        prompt = sum(r.prompt_tokens for r in self.requests)
        usage: dict[str, Any] = {"prompt_tokens": prompt, "total_tokens": prompt,
                                 "completion_tokens": 0, "prompt_tokens_details": None}
        if self.engine == "vllm":
            data = [{"index": i, "object": "embedding", "embedding": self._encode(v, True)}
                    for i, v in enumerate(vectors)]
            usage["completion_tokens_details"] = None
            body = {"id": f"embd-{secrets.token_hex(8)}", "object": "list",
                    "created": self.created, "model": self.model, "data": data, "usage": usage}
        else:
            data = [{"embedding": self._encode(v, False), "index": i, "object": "embedding"}
                    for i, v in enumerate(vectors)]
            usage |= {"reasoning_tokens": 0, "completion_tokens_details": None}
            body = {"data": data, "model": self.model, "object": "list", "usage": usage}
        return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)

    def _encode(self, vector: np.ndarray, as_float32: bool) -> Any:
        if self.encoding == "base64":
            return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
        return vector if as_float32 else [float(x) for x in vector]


def unit_vector(seed: str, dim: int) -> np.ndarray:
    """A deterministic float32 unit vector of ``dim`` components."""
    blocks = math.ceil(dim / 8)
    raw = b"".join(hashlib.sha256(f"{seed}|{i}".encode()).digest() for i in range(blocks))
    ints = np.frombuffer(raw, dtype="<u4")[:dim].astype(np.float64)
    vec = ints / 2.0**31 - 1.0
    norm = float(np.linalg.norm(vec)) or 1.0
    out: np.ndarray = (vec / norm).astype(np.float32)
    return out


def parse_embeddings(
    body: dict[str, Any], limits: EngineLimits, created: int, d_model: int, model_path: str
) -> EmbeddingJob:
    engine = limits.engine
    encoding = body.get("encoding_format", "float")
    if "input" not in body:
        raise _invalid(engine, "Field required: input", "body.input")
    if encoding not in ("float", "base64"):
        if engine == "sglang":
            raise EngineError(400, "encoding_format must be either 'float' or 'base64', got "
                              f"{encoding!r}", "BadRequestError")
        raise _invalid(engine, f"encoding_format {encoding!r} is not served by the emulator",
                       "body.encoding_format")
    model = body.get("model")
    if engine == "vllm" and model is not None and model not in limits.served_models:
        valid = ", ".join(limits.served_models)
        raise EngineError(404, f"The model `{model}` does not exist. Valid aliases: {valid}.",
                          "NotFoundError", "model")
    items = _inputs(body["input"], engine)
    dim = body.get("dimensions")
    if dim is not None and (isinstance(dim, bool) or not isinstance(dim, int)
                            or not 1 <= dim <= d_model):
        raise EngineError(400, f"dimensions must be between 1 and {d_model}, got {dim}",
                          "BadRequestError", "dimensions")
    requests = tuple(_request(i, tokens, limits, created) for i, (_, tokens) in enumerate(items))
    name = limits.served_models[0] if engine == "vllm" else model_path
    return EmbeddingJob(engine, requests, tuple(text for text, _ in items), dim or d_model,
                        encoding, name, created)


def _invalid(engine: str, message: str, param: str) -> EngineError:
    if engine == "vllm":
        return EngineError(400, f"1 validation error:\n  {message}", "Bad Request", param)
    return EngineError(400, message, "Bad Request")


def _inputs(value: Any, engine: str) -> list[tuple[str, int]]:
    """(the text a vector is derived from, prompt tokens) per input."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise EngineError(400, "Input cannot be empty", "BadRequestError")
    if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return [(orjson.dumps(value).decode(), len(value))]
    out: list[tuple[str, int]] = []
    for i, item in enumerate(value):
        if isinstance(item, str):
            if engine == "sglang" and not item.strip():
                raise EngineError(400, f"Input at index {i} cannot be empty or whitespace only",
                                  "BadRequestError")
            out.append((item, 1 + text_tokens(item)))
        elif isinstance(item, Sequence) and all(isinstance(t, int) for t in item) and item:
            out.append((orjson.dumps(list(item)).decode(), len(item)))
        else:
            raise EngineError(400, "All items in input list must be strings", "BadRequestError")
    return out


def _request(index: int, tokens: int, limits: EngineLimits, created: int) -> ParsedRequest:
    ctx = limits.max_model_len
    if tokens >= ctx:  # the pooling step needs one more slot in the KV cache
        if limits.engine == "vllm":
            raise EngineError(400, f"This model's maximum context length is {ctx} tokens. "
                              f"However, your prompt contains {tokens} input tokens. Please "
                              f"reduce the length of the input. (parameter=input_tokens, "
                              f"value={tokens})", "BadRequestError", "input_tokens")
        raise EngineError(400, f"The input ({tokens} tokens) is longer than the model's context "
                          f"length ({ctx} tokens).", "BadRequestError")
    return ParsedRequest(kind="completion", request_id=f"embd-{secrets.token_hex(8)}-{index}",
                         model=limits.served_models[0], created=created, prompt_tokens=tokens,
                         max_tokens=1, finish_reason="stop", stream=False, include_usage=False,
                         continuous_usage=False, pooling=True)
