"""JSONB parameters: orjson first, the stdlib as the fallback."""

from __future__ import annotations

import json
from typing import Any

import orjson
from psycopg.types.json import Jsonb


def _jsonb_dumps(obj: Any) -> str:
    try:
        return orjson.dumps(obj).decode()
    except TypeError:
        return json.dumps(obj)


def _jsonb(obj: Any) -> Jsonb:
    return Jsonb(obj, dumps=_jsonb_dumps)


def _as_is(text: Any) -> Any:
    return text


def _jsonb_now(obj: Any) -> Jsonb:
    """JSON dumped now, not when psycopg adapts the parameter: an error then, inside a
    pipeline sent as one implicit transaction, would leave the statements sent before
    it to commit (blobs and artifacts without their checkpoint). Same cost, earlier."""
    return Jsonb(_jsonb_dumps(obj), dumps=_as_is)


def _json_problem(value: Any) -> str | None:
    try:
        _jsonb_dumps(value)
    except Exception as exc:
        return f"{type(value).__name__} is not JSON ({type(exc).__name__}: {exc})"
    return None


# Public names (other modules import them; ``saver._jsonb`` stays as an alias).
jsonb = _jsonb
jsonb_dumps = _jsonb_dumps
