"""Helpers for the emulator API tests: an emulator under uvicorn in a thread, SSE parsing
(with and without ``event:`` lines), fixture loading, key-order comparison, and a tiny
JSON-Schema checker (no jsonschema dependency)."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path
from typing import Any

import uvicorn

from fleetgate.emulator import EmulatorConfig, create_emulator_app
from procs import wait_for

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
ALIAS = "llama-3.1-8b"
ENGINES = ("vllm", "sglang")
DATA = Path(__file__).resolve().parents[1] / "data"


class EmulatorThread:
    """An emulator app under uvicorn in a background thread, on a free port."""

    def __init__(self, config: EmulatorConfig) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        uv = uvicorn.Config(create_emulator_app(config), http="httptools", lifespan="on",
                            log_level="warning", access_log=False)
        self.server = uvicorn.Server(uv)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True)

    def __enter__(self) -> EmulatorThread:
        self.thread.start()
        wait_for(lambda: self.server.started, timeout=10, what="the emulator to start")
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


def emulator_config(engine: str, **kw: Any) -> EmulatorConfig:
    gpu = "h100" if engine == "vllm" else "mi300x"
    settings: dict[str, Any] = {"engine": engine, "gpu": gpu,
                                "served_models": [MODEL, ALIAS], "speed": 50.0}
    return EmulatorConfig.model_validate(settings | kw)


def fixture_text(name: str) -> str:
    return (DATA / name).read_text()


def fixture_json(name: str) -> Any:
    return json.loads(fixture_text(name))


def sse_frames(body: str) -> list[tuple[str | None, Any]]:
    """(event name or None, decoded data or "[DONE]") per frame; asserts SSE framing."""
    frames = []
    for raw in body.split("\n\n"):
        if not raw:
            continue
        event, data = None, None
        for line in raw.split("\n"):
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                data = line[6:]
            else:
                raise AssertionError(f"not an SSE line: {line!r}")
        assert data is not None, raw
        frames.append((event, data if data == "[DONE]" else json.loads(data)))
    return frames


def key_shape(value: Any) -> Any:
    """The nested key order of ``value`` (dict keys in order; lists by their first item)."""
    if isinstance(value, dict):
        return [(k, key_shape(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [key_shape(value[0])] if value else []
    return None


def same_keys(ours: Any, theirs: Any, path: str = "$") -> None:
    """Assert that dicts have the same keys in the same order, recursively, where both sides
    are containers (a null on one side and a value on the other is allowed)."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        assert list(ours) == list(theirs), f"{path}: {list(ours)} != {list(theirs)}"
        for key in ours:
            same_keys(ours[key], theirs[key], f"{path}.{key}")
    elif isinstance(ours, list) and isinstance(theirs, list) and ours and theirs:
        same_keys(ours[0], theirs[0], f"{path}[0]")


def check_schema(value: Any, schema: dict[str, Any], root: dict[str, Any] | None = None) -> None:
    """Raise AssertionError unless ``value`` satisfies the subset of JSON Schema the emulator
    claims to honour (type, enum, const, required, properties, items, bounds, lengths,
    anyOf/oneOf/allOf, local $ref)."""
    root = root if root is not None else schema
    if "$ref" in schema:
        node: Any = root
        for part in schema["$ref"][2:].split("/"):
            node = node[part]
        check_schema(value, node, root)
        return
    if "const" in schema:
        assert value == schema["const"]
    if "enum" in schema:
        assert value in schema["enum"], (value, schema["enum"])
    for key in ("anyOf", "oneOf"):
        if key in schema:
            errors = 0
            for sub in schema[key]:
                try:
                    check_schema(value, sub, root)
                except AssertionError:
                    errors += 1
            assert errors < len(schema[key]), f"{value!r} matches no branch of {key}"
    for sub in schema.get("allOf", []):
        check_schema(value, sub, root)
    kinds = schema.get("type")
    if kinds is not None:
        kinds = kinds if isinstance(kinds, list) else [kinds]
        assert any(_is(value, k) for k in kinds), f"{value!r} is not {kinds}"
    if isinstance(value, dict):
        for name in schema.get("required", []):
            assert name in value, f"missing required {name!r}"
        for name, sub in schema.get("properties", {}).items():
            if name in value:
                check_schema(value[name], sub, root)
        if schema.get("additionalProperties") is False:
            assert set(value) <= set(schema.get("properties", {}))
        assert len(value) >= schema.get("minProperties", 0)
    if isinstance(value, list):
        assert len(value) >= schema.get("minItems", 0)
        assert len(value) <= schema.get("maxItems", len(value))
        if isinstance(schema.get("items"), dict):
            for item in value:
                check_schema(item, schema["items"], root)
    if isinstance(value, str):
        assert schema.get("minLength", 0) <= len(value) <= schema.get("maxLength", len(value))
    if _is(value, "number"):
        assert value >= schema.get("minimum", value)
        assert value <= schema.get("maximum", value)
        if "exclusiveMinimum" in schema:
            assert value > schema["exclusiveMinimum"]
        if "exclusiveMaximum" in schema:
            assert value < schema["exclusiveMaximum"]
        if "multipleOf" in schema:
            assert (value / schema["multipleOf"]) == int(value / schema["multipleOf"])


def _is(value: Any, kind: str) -> bool:
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return {
        "object": isinstance(value, dict), "array": isinstance(value, list),
        "string": isinstance(value, str), "boolean": isinstance(value, bool),
        "null": value is None,
    }.get(kind, True)
