"""Deliberately broken variants of the package: the property and chaos tests must FAIL
with each (a check that cannot fail checks nothing). Test-only; never imported unless
``LGD_MUTANT`` names one (tests/conftest.py applies it in the test process,
tests/_child_chaos.py in the chaos children, which inherit the environment).

    LGD_MUTANT=refuse-kinds .venv/bin/python -m pytest tests/test_value_roundtrip.py -p no:randomly
    LGD_MUTANT=no-fence     .venv/bin/python -m pytest tests/test_model_chaos.py -p no:randomly

``.venv/bin/python tests/mutants/run.py`` runs each mutant against its test file and reports
whether the suite caught it (exit 1 if one survived).

* ``refuse-kinds``: the durable saver's serializer refuses every value containing a
  frozenset, Decimal, UUID, datetime/date/time/timedelta or pydantic model (a typed
  UnencodableValueError, nothing written): values the stock saver stores.
* ``no-fence``: writes skip the lease fence (a put / put_writes / update_state is not
  checked against the live lease): another writer's update lands during a run, and a
  run that lost its lease keeps writing.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import uuid
from collections.abc import Callable
from typing import Any

MUTANTS: dict[str, Callable[[], None]] = {}
APPLIED: list[str] = []


def mutant(fn: Callable[[], None]) -> Callable[[], None]:
    MUTANTS[fn.__name__.replace("_", "-")] = fn
    return fn


def apply(name: str) -> None:
    if name in APPLIED:
        return
    if name not in MUTANTS:
        raise SystemExit(f"LGD_MUTANT={name!r}: not one of {sorted(MUTANTS)}")
    MUTANTS[name]()
    APPLIED.append(name)


_REFUSED = (frozenset, decimal.Decimal, uuid.UUID, dt.datetime, dt.date, dt.time, dt.timedelta)


def _contains_refused(value: Any, depth: int = 0) -> bool:
    if isinstance(value, _refused_types()):
        return True
    if depth > 30:
        return False
    if isinstance(value, dict):
        return any(_contains_refused(v, depth + 1) for v in value.values())
    if isinstance(value, list | tuple | set):
        return any(_contains_refused(v, depth + 1) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return any(_contains_refused(getattr(value, f.name), depth + 1) for f in dataclasses.fields(value))
    return False


def _refusal(value: Any, where: Any, root: str) -> Any:
    """The saver's own typed error, naming the refused element's exact path (the saver's
    locator with a reject function for the refused kinds): a well-behaved refusal."""
    from langgraph_durable import _values
    from langgraph_durable.errors import UnencodableValueError

    def reject(v: Any) -> str | None:
        return f"{type(v).__name__} refused (mutant refuse-kinds)" if _contains_refused(v) else None

    path, culprit, reason = _values.find_unencodable(value, reject, root) or (root, value, "mutant refuse-kinds")
    err = UnencodableValueError(**where, path=path, value_type=type(culprit).__name__, reason=reason)
    err.__cause__ = TypeError(reason)
    return err


def _refused_types() -> tuple[type, ...]:
    from pydantic import BaseModel

    return (*_REFUSED, BaseModel)


@mutant
def refuse_kinds() -> None:
    from langgraph_durable.core import write

    original, rows = write.WriteOps._encode, write.WriteOps._write_rows

    def _encode(self: Any, value: Any, where: Any, root: str) -> Any:
        if _contains_refused(value):
            raise _refusal(value, where, root)
        return original(self, value, where, root)

    def _write_rows(self: Any, writes: Any, task_id: str, task_path: str, where: Any) -> Any:
        for channel, value in writes:
            if _contains_refused(value):
                raise _refusal(value, where, f"writes[{channel!r}]")
        return rows(self, writes, task_id, task_path, where)

    write.WriteOps._encode = _encode  # type: ignore[method-assign]
    write.WriteOps._write_rows = _write_rows  # type: ignore[method-assign]


@mutant
def no_fence() -> None:
    from langgraph_durable.leases import fence
    from langgraph_durable.sql.checkpoints import guard_params
    from langgraph_durable.sql.threads import FOREIGN_LEASE_SQL

    def _fence(self: Any, thread_id: str, *, raising: bool = False, config: Any = None) -> Any:
        from langgraph_durable._io import Stmt

        # The foreign-lease statement, never the raising one; _check_fence ignores it.
        return Stmt(FOREIGN_LEASE_SQL, (thread_id,), fetch=True), None

    def _guard(self: Any, thread_id: str, config: Any, checkpoint_ns: Any, checkpoint_id: Any) -> Any:
        return "none", guard_params("none", thread_id, None, None, checkpoint_ns, checkpoint_id), None

    def _check_fence(self: Any, thread_id: str, lease: Any, rows: list[Any]) -> None:
        return None

    fence.FenceOps._fence = _fence  # type: ignore[method-assign]
    fence.FenceOps._guard = _guard  # type: ignore[method-assign]
    fence.FenceOps._check_fence = _check_fence  # type: ignore[method-assign]
