"""A minimal, deterministic JSON-Schema instance generator for emulated structured output.

``instance(schema, seed)`` returns a small JSON value that validates against ``schema`` — what
an engine's guided decoding (xgrammar) would force a model to write, in place of the model's
own choice: tool-call ``arguments`` (the tool's ``parameters``), ``response_format``
``json_schema`` / ``json_object`` content, Responses ``text.format`` and Anthropic
``output_config.format``. Same schema and seed -> same value.

Supported: ``type`` (one or a list; ``null`` only when nothing else is allowed), ``const``,
``enum`` (first value), ``object`` (every ``required`` property; a schema without ``required``
gets none of its optional ones, except that an empty ``{"type": "object"}`` stays ``{}``),
``additionalProperties`` / ``minProperties`` (filled with ``field_N`` keys when required),
``string`` (``minLength`` / ``maxLength``, ``format`` date / date-time / time / email / uri /
uuid), ``integer`` / ``number`` (``minimum``, ``maximum``, exclusive bounds, ``multipleOf``),
``boolean``, ``array`` (``minItems`` items of ``items`` / ``prefixItems``), ``anyOf`` /
``oneOf`` (first branch), ``allOf`` (merged), local ``$ref`` (``#/$defs/...``,
``#/definitions/...``). Not honoured: ``pattern`` (a string of the right length is written),
``not``, ``if``/``then``, ``uniqueItems`` beyond distinct generated strings.

May touch: the standard library. Must not touch: I/O, clocks, the engine.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

_WORDS = ("alpha", "bravo", "delta", "echo", "kilo", "lima", "nova", "oscar", "sierra", "tango")
_MAX_DEPTH = 12

Json = Any


def instance(schema: Any, seed: str = "") -> Json:
    """A minimal value valid for ``schema`` (a JSON Schema dict; ``True``/``{}`` = anything)."""
    return _Gen(schema if isinstance(schema, dict) else {}, seed).value(schema, "$", 0)


class _Gen:
    def __init__(self, root: dict[str, Any], seed: str) -> None:
        self.root, self.seed = root, seed

    def value(self, schema: Any, path: str, depth: int) -> Json:
        if not isinstance(schema, dict) or depth > _MAX_DEPTH:
            return None if depth > _MAX_DEPTH else {}
        schema = self.resolve(schema)
        if "const" in schema:
            return schema["const"]
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            return schema["enum"][0]
        for key in ("anyOf", "oneOf"):
            if isinstance(schema.get(key), list) and schema[key]:
                branch = self.merge(schema, schema[key][0], drop=key)
                return self.value(branch, path, depth + 1)
        if isinstance(schema.get("allOf"), list):
            merged = {k: v for k, v in schema.items() if k != "allOf"}
            for part in schema["allOf"]:
                merged = self.merge(merged, self.resolve(part) if isinstance(part, dict) else {})
            return self.value(merged, path, depth + 1)
        kind = self.kind(schema)
        if kind == "object":
            return self.obj(schema, path, depth)
        if kind == "array":
            return self.array(schema, path, depth)
        if kind == "string":
            return self.string(schema, path)
        if kind in ("integer", "number"):
            return self.number(schema, kind == "integer")
        if kind == "boolean":
            return True
        if kind == "null":
            return None
        return {}

    def resolve(self, schema: dict[str, Any]) -> dict[str, Any]:
        ref, seen = schema.get("$ref"), 0
        while isinstance(ref, str) and ref.startswith("#/") and seen < _MAX_DEPTH:
            node: Any = self.root
            for part in ref[2:].split("/"):
                node = node.get(part.replace("~1", "/").replace("~0", "~"), {}) if isinstance(
                    node, dict) else {}
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            schema = {**(node if isinstance(node, dict) else {}), **rest}
            ref, seen = schema.get("$ref"), seen + 1
        return schema

    @staticmethod
    def merge(base: dict[str, Any], extra: Any, drop: str | None = None) -> dict[str, Any]:
        out = {k: v for k, v in base.items() if k != drop}
        if not isinstance(extra, dict):
            return out
        for key, val in extra.items():
            if key == "properties" and isinstance(out.get(key), dict) and isinstance(val, dict):
                out[key] = {**out[key], **val}
            elif key == "required" and isinstance(out.get(key), list) and isinstance(val, list):
                out[key] = list(dict.fromkeys([*out[key], *val]))
            else:
                out[key] = val
        return out

    @staticmethod
    def kind(schema: dict[str, Any]) -> str | None:
        kind = schema.get("type")
        if isinstance(kind, list):
            kinds = [k for k in kind if isinstance(k, str)]
            kind = next((k for k in kinds if k != "null"), kinds[0] if kinds else None)
        if isinstance(kind, str):
            return kind
        if "properties" in schema or "required" in schema:
            return "object"
        if "items" in schema or "prefixItems" in schema:
            return "array"
        return None

    def obj(self, schema: dict[str, Any], path: str, depth: int) -> dict[str, Json]:
        raw_props = schema.get("properties")
        props: dict[str, Any] = raw_props if isinstance(raw_props, dict) else {}
        required = [r for r in schema.get("required") or [] if isinstance(r, str)]
        out: dict[str, Json] = {}
        for name in required:
            out[name] = self.value(props.get(name, {}), f"{path}.{name}", depth + 1)
        extra = schema.get("additionalProperties", True)
        need = _int(schema.get("minProperties"), 0) - len(out)
        optional = [p for p in props if p not in out]
        for name in optional[: max(need, 0)]:
            out[name] = self.value(props[name], f"{path}.{name}", depth + 1)
        i = 0
        while len(out) < _int(schema.get("minProperties"), 0) and extra is not False:
            out[f"field_{i}"] = self.value(extra if isinstance(extra, dict) else {},
                                           f"{path}.field_{i}", depth + 1)
            i += 1
        return out

    def array(self, schema: dict[str, Any], path: str, depth: int) -> list[Json]:
        raw_prefix = schema.get("prefixItems")
        prefix: list[Any] = raw_prefix if isinstance(raw_prefix, list) else []
        items = schema.get("items", {})
        count = max(_int(schema.get("minItems"), 0), len(prefix))
        out = []
        for i in range(count):
            sub = prefix[i] if i < len(prefix) else items
            out.append(self.value(sub if isinstance(sub, dict) else {}, f"{path}[{i}]", depth + 1))
        return out

    def string(self, schema: dict[str, Any], path: str) -> str:
        fmt = schema.get("format")
        fixed = {"date": "2026-01-01", "date-time": "2026-01-01T00:00:00Z", "time": "00:00:00Z",
                 "email": "user@example.com", "uri": "https://example.com/",
                 "uuid": "00000000-0000-4000-8000-000000000000"}.get(str(fmt))
        if fixed is not None:
            return fixed
        low = _int(schema.get("minLength"), 0)
        high = _int(schema.get("maxLength"), max(low, 16))
        digest = hashlib.sha256(f"{self.seed}|{path}".encode()).digest()
        text = _WORDS[digest[0] % len(_WORDS)]
        while len(text) < low:
            text += " " + _WORDS[(digest[len(text) % 32]) % len(_WORDS)]
        return text[: max(high, low)] if len(text) > high else text

    @staticmethod
    def number(schema: dict[str, Any], integer: bool) -> int | float:
        lo, xlo = _num(schema.get("minimum")), _num(schema.get("exclusiveMinimum"))
        hi, xhi = _num(schema.get("maximum")), _num(schema.get("exclusiveMaximum"))

        def ok(v: float) -> bool:
            return ((lo is None or v >= lo) and (xlo is None or v > xlo)
                    and (hi is None or v <= hi) and (xhi is None or v < xhi))

        floor = max((b for b in (lo, xlo) if b is not None), default=None)
        ceiling = min((b for b in (hi, xhi) if b is not None), default=None)
        base = floor if floor is not None else (
            1.0 if ceiling is None or ceiling > 1 else ceiling - 1)
        unit = _num(schema.get("multipleOf")) or (1.0 if integer else None)
        if unit:
            first = math.ceil(base / unit)
            for n in (*range(first, first + 3), *range(first - 1, first - 4, -1)):
                if ok(n * unit):
                    value = n * unit
                    break
            else:
                value = first * unit
        else:
            mid = (base + ceiling) / 2 if ceiling is not None else base + 1
            value = next((v for v in (base, mid, base + 1) if ok(v)), base)
        return int(value) if integer else float(value)


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else (
        default)
