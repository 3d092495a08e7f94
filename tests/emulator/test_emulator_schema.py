"""The minimal JSON-Schema instance generator (emulator/schema.py) against a tiny checker."""

from __future__ import annotations

from typing import Any

import pytest
from wire_helpers import check_schema

from fleetgate.emulator.schema import instance

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
    "required": ["city", "unit"],
}

SCHEMAS: dict[str, dict[str, Any]] = {
    "weather": WEATHER,
    "empty-object": {"type": "object"},
    "anything": {},
    "scalars": {
        "type": "object",
        "properties": {
            "n": {"type": "integer", "minimum": 3, "maximum": 9},
            "x": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
            "m": {"type": "integer", "multipleOf": 5, "minimum": 7},
            "neg": {"type": "number", "maximum": -2.5},
            "flag": {"type": "boolean"},
            "nothing": {"type": "null"},
            "fixed": {"const": "v1"},
            "maybe": {"type": ["string", "null"]},
            "when": {"type": "string", "format": "date-time"},
            "long": {"type": "string", "minLength": 30, "maxLength": 40},
            "short": {"type": "string", "maxLength": 3},
        },
        "required": ["n", "x", "m", "neg", "flag", "nothing", "fixed", "maybe", "when", "long",
                     "short"],
        "additionalProperties": False,
    },
    "nested": {
        "type": "object",
        "properties": {
            "order": {
                "type": "object",
                "properties": {
                    "items": {"type": "array", "minItems": 2, "items": {
                        "type": "object",
                        "properties": {"sku": {"type": "string"},
                                       "qty": {"type": "integer", "minimum": 1}},
                        "required": ["sku", "qty"]}},
                    "note": {"type": "string"},
                },
                "required": ["items"],
            },
        },
        "required": ["order"],
    },
    "refs": {
        "$defs": {"Point": {"type": "object", "properties": {"x": {"type": "number"},
                                                             "y": {"type": "number"}},
                            "required": ["x", "y"]}},
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/Point"},
                       "path": {"type": "array", "items": {"$ref": "#/$defs/Point"},
                                "minItems": 1}},
        "required": ["a", "path"],
    },
    "combinators": {
        "type": "object",
        "properties": {
            "choice": {"anyOf": [{"type": "integer", "minimum": 10}, {"type": "string"}]},
            "one": {"oneOf": [{"type": "boolean"}, {"type": "null"}]},
            "both": {"allOf": [{"type": "object", "properties": {"p": {"type": "string"}},
                                "required": ["p"]},
                               {"properties": {"q": {"type": "integer"}}, "required": ["q"]}]},
        },
        "required": ["choice", "one", "both"],
    },
    "min-properties": {"type": "object", "minProperties": 2,
                       "additionalProperties": {"type": "integer"}},
    "top-array": {"type": "array", "items": {"type": "string", "enum": ["x", "y"]},
                  "minItems": 3},
}


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_instance_validates(name: str) -> None:
    schema = SCHEMAS[name]
    value = instance(schema, seed="s1")
    check_schema(value, schema)


def test_instances_are_minimal_and_deterministic() -> None:
    assert instance({"type": "object"}) == {}
    optional = {"type": "object", "properties": {"a": {"type": "string"}}}
    assert instance(optional) == {}  # only required properties are written
    assert instance(SCHEMAS["nested"], "x") == instance(SCHEMAS["nested"], "x")
    values = {instance(WEATHER, seed=str(i))["city"] for i in range(20)}
    assert len(values) > 1  # the seed picks the words


def test_checker_catches_a_bad_value() -> None:
    with pytest.raises(AssertionError):
        check_schema({"city": "Paris", "unit": "k"}, WEATHER)
    with pytest.raises(AssertionError):
        check_schema({"city": "Paris"}, WEATHER)
