"""``Ledger``: the operator API over recorded calls (inspect, resolve, forget, purge).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import (
    Generator,
    Mapping,
)
from dataclasses import dataclass
from typing import Any, cast

from langgraph_durable import _sealing
from langgraph_durable import audit as _audit
from langgraph_durable._io import (
    Batch,
    Stmt,
    op_memo,
)
from langgraph_durable._sealing import Keyring
from langgraph_durable.core.base import _DurableBase
from langgraph_durable.errors import (
    CallInFlightError,
    ConfigurationError,
    IdempotencyError,
    SerializationError,
)
from langgraph_durable.idempotency.protocol import _op_one
from langgraph_durable.leases.owners import owner_is_dead
from langgraph_durable.sql.ledger import (
    LEDGER_FORGET_SQL,
    LEDGER_LIST_SQL,
    LEDGER_PURGE_EXPIRED_SQL,
    LEDGER_READ_SQL,
    LEDGER_RESOLVE_SQL,
)

logger = logging.getLogger("langgraph_durable.idempotency")

# --- operators --------------------------------------------------------------------------


@dataclass(frozen=True)
class LedgerEntry:
    """One recorded call, as an operator sees it."""

    key: str
    status: str  # started | completed | failed
    name: str | None
    thread_id: str | None
    origin_thread_id: str | None
    task_id: str | None
    attempts: int
    in_flight: bool  # started, and its claim is still renewed by a live process
    outcome_unknown: bool  # started, claim expired: the process died mid-call
    error_type: str | None
    error: str | None
    args_preview: str | None
    fingerprint: str
    created_at: dt.datetime | None
    completed_at: dt.datetime | None
    expires_at: dt.datetime | None

    @classmethod
    def from_row(
        cls, row: Mapping[str, Any], ring: Keyring | None = None, *, lenient: bool = False
    ) -> LedgerEntry:
        """``ring``: the saver's keyring, opening what is sealed (issue 27); without
        one a sealed text reads ``"<encrypted>"``, as does one under a key ``ring``
        lacks when ``lenient`` (a listing), else that is ``DecryptionError``."""
        started = row["status"] == "started"
        thread = row["thread_id"] or row["origin_thread_id"]

        def opened(column: str) -> str | None:
            where = f"{column} of idempotency key {row['key']!r}"
            return _sealing.open_text(
                ring, row[column], thread_id=thread, where=where, strict=False, lenient=lenient
            )

        # A claim whose owner is a dead process of this machine is dead now, whatever
        # its claim lease says (the check a run start makes on its lease).
        live = bool(row["live"]) and not owner_is_dead(row.get("owner"))
        return cls(
            key=row["key"],
            status=row["status"],
            name=row["name"],
            thread_id=row["thread_id"],
            origin_thread_id=row["origin_thread_id"],
            task_id=row["task_id"],
            attempts=int(row["attempts"] or 1),
            in_flight=started and live,
            outcome_unknown=started and not live,
            error_type=row["error_type"],
            error=opened("error"),
            args_preview=opened("args_preview"),
            fingerprint=row["fingerprint"],
            created_at=row["created_at"],
            completed_at=row["completed_at"],
            expires_at=row["expires_at"],
        )


class Ledger:
    """Inspect and repair the idempotency ledger of a durable saver.

    ``resolve`` and ``forget`` are the operator's answers to an ``OutcomeUnknownError``:
    the effect happened (record its result; the call is never run again) or it did not
    (drop the key; the next call runs the function). Both refuse a call in flight.
    Sync methods use the saver's sync path, ``a*`` methods its async path.
    """

    def __init__(self, saver: _DurableBase) -> None:
        if not isinstance(saver, _DurableBase):
            raise ConfigurationError(
                "Ledger needs a DurablePostgresSaver or AsyncDurablePostgresSaver, got "
                f"{type(saver).__name__}"
            )
        self.saver = saver

    # ops (one definition each; the sync and async methods only pick the runner)
    def _op_get(self, key: str) -> Generator[Any, Any, LedgerEntry | None]:
        rows = yield from _op_one(LEDGER_READ_SQL, (key,))
        return LedgerEntry.from_row(rows[0], _sealing.keyring_of(self.saver.serde)) if rows else None

    def _op_entries(
        self, thread_id: str | None, status: str | None, limit: int
    ) -> Generator[Any, Any, list[LedgerEntry]]:
        rows = yield from _op_one(
            LEDGER_LIST_SQL, {"thread_id": thread_id, "status": status, "limit": int(limit)}
        )
        ring = _sealing.keyring_of(self.saver.serde)
        return [LedgerEntry.from_row(r, ring, lenient=True) for r in rows]

    def _op_result(self, key: str) -> Generator[Any, Any, Any]:
        rows = yield from _op_one(LEDGER_READ_SQL, (key,))
        if not rows or rows[0]["status"] != "completed":
            raise IdempotencyError(f"idempotency key {key!r} has no recorded result", key=key)
        row = rows[0]
        try:
            return self.saver.serde.loads_typed((row["result_type"], bytes(row["result"] or b"")))
        except Exception as exc:
            wrong_key = _sealing.decrypt_failure(
                self.saver.serde, str(row["result_type"]), exc,
                thread_id=row["thread_id"] or row.get("origin_thread_id"),
                where=f"the recorded result of idempotency key {key!r}",
            )
            if wrong_key is not None:
                raise wrong_key from exc
            raise SerializationError(
                f"the recorded result of idempotency key {key!r} cannot be decoded: {exc}",
                value_type=str(row["result_type"]),
                key=key,
            ) from exc

    def _encode_result(self, key: str, result: Any) -> tuple[str, bytes]:
        try:
            tag, data = self.saver.serde.dumps_typed(result)
        except Exception as exc:
            raise SerializationError(
                f"result for idempotency key {key!r} cannot be serialized: {exc}",
                value_type=type(result).__qualname__,
                key=key,
            ) from exc
        return tag, data

    @_audit.audited("ledger.resolve", _audit.describe_ledger_change, prefetch=_audit.ledger_row)
    def _op_change(self, sql: str, key: str, params: tuple[Any, ...]) -> Generator[Any, Any, None]:
        memo = op_memo()
        if _sealing.keyring_of(self.saver.serde) is None:
            yield from self._op_refuse_keyless(key)
        changed, current = yield from _op_answer(sql, key, params)
        if changed:
            memo["changed"] = True
            return
        if memo.get("changed") and current is not None and current["status"] == "completed":
            return  # this very change, committed; the driver retried after a lost reply
        if current is None:
            raise IdempotencyError(f"idempotency key {key!r} is not in the ledger", key=key)
        if current["status"] == "started" and current["live"]:
            raise CallInFlightError(key, 0.0)
        raise IdempotencyError(
            f"idempotency key {key!r} is already {current['status']}", key=key
        )

    @staticmethod
    def _op_refuse_keyless(key: str) -> Generator[Any, Any, None]:
        """A saver without a key resolving an encrypted row (its arguments sealed, or
        a result in the cipher's form): its serializer would store the operator's value
        in the clear beside them (issue 27; the CLI without --key-file, a console
        without the key). Refused, nothing written."""
        rows = yield from _op_one(LEDGER_READ_SQL, (key,))
        row = rows[0] if rows else None
        if row is not None and (
            _sealing.is_sealed(row.get("args_preview")) or _sealing.is_sealed(row.get("error"))
            or "+" in str(row.get("result_type") or "")
        ):
            raise _sealing.DecryptionError(
                thread_id=row.get("thread_id"), where="durable_ledger.result",
                reason="the ledger row is encrypted and this saver has no key: the result would "
                "be stored in the clear; give the key (--key-file, the saver's encrypting serde)",
            )

    @_audit.audited("ledger.forget", _audit.describe_ledger_forget, prefetch=_audit.ledger_row)
    def _op_forget(self, key: str) -> Generator[Any, Any, bool]:
        memo = op_memo()
        forgot, current = yield from _op_answer(LEDGER_FORGET_SQL, key, (key,))
        if forgot:
            memo["forgot"] = True
            return True
        if current is not None:
            raise CallInFlightError(key, 0.0)
        return bool(memo.get("forgot"))  # True: this forget committed, its reply was lost

    @_audit.audited("ledger.purge_expired", _audit.describe_ledger_purge)
    def _op_purge(self) -> Generator[Any, Any, int]:
        rows = yield Batch([Stmt(LEDGER_PURGE_EXPIRED_SQL + " RETURNING key", None, fetch=True)])
        return len(rows[0])

    # sync
    def get(self, key: str) -> LedgerEntry | None:
        return cast("LedgerEntry | None", self.saver.run_op(lambda: self._op_get(key)))

    def entries(
        self, *, thread_id: str | None = None, status: str | None = None, limit: int = 100
    ) -> list[LedgerEntry]:
        return cast(
            "list[LedgerEntry]", self.saver.run_op(lambda: self._op_entries(thread_id, status, limit))
        )

    def result(self, key: str) -> Any:
        return self.saver.run_op(lambda: self._op_result(key))

    def resolve(self, key: str, result: Any) -> None:
        """The effect happened: record ``result`` as the call's outcome."""
        tag, data = self._encode_result(key, result)
        self.saver.run_op(lambda: self._op_change(LEDGER_RESOLVE_SQL, key, (tag, data, key)))

    def forget(self, key: str) -> bool:
        """The effect did not happen (or should happen again): drop the key."""
        return cast(bool, self.saver.run_op(lambda: self._op_forget(key)))

    def purge_expired(self) -> int:
        """Delete keys whose TTL ran out; returns how many."""
        return cast(int, self.saver.run_op(self._op_purge))

    # async
    async def aget(self, key: str) -> LedgerEntry | None:
        return cast("LedgerEntry | None", await self.saver.arun_op(lambda: self._op_get(key)))

    async def aentries(
        self, *, thread_id: str | None = None, status: str | None = None, limit: int = 100
    ) -> list[LedgerEntry]:
        return cast(
            "list[LedgerEntry]",
            await self.saver.arun_op(lambda: self._op_entries(thread_id, status, limit)),
        )

    async def aresult(self, key: str) -> Any:
        return await self.saver.arun_op(lambda: self._op_result(key))

    async def aresolve(self, key: str, result: Any) -> None:
        tag, data = self._encode_result(key, result)
        await self.saver.arun_op(lambda: self._op_change(LEDGER_RESOLVE_SQL, key, (tag, data, key)))

    async def aforget(self, key: str) -> bool:
        return cast(bool, await self.saver.arun_op(lambda: self._op_forget(key)))

    async def apurge_expired(self) -> int:
        return cast(int, await self.saver.arun_op(self._op_purge))


def _op_answer(
    sql: str, key: str, params: tuple[Any, ...]
) -> Generator[Any, Any, tuple[bool, dict[str, Any] | None]]:
    """Run an operator's answer (resolve's or forget's statement, whose last parameter
    is the owner judged dead): (whether it changed the row, the row after it). A claim
    lease still running whose owner is a dead process of this machine is no call in
    flight: the answer is sent again naming that owner, in the same transaction."""
    rows = yield Batch(
        [Stmt(sql, (*params, None), fetch=True, name="changed"), Stmt(LEDGER_READ_SQL, (key,), fetch=True, name="row")]
    )
    current = rows["row"][0] if rows["row"] else None
    if not rows["changed"] and current is not None and current["status"] == "started" and current["live"]:
        if owner_is_dead(current["owner"]):
            rows = yield Batch(
                [
                    Stmt(sql, (*params, current["owner"]), fetch=True, name="changed"),
                    Stmt(LEDGER_READ_SQL, (key,), fetch=True, name="row"),
                ]
            )
            current = rows["row"][0] if rows["row"] else None
    return bool(rows["changed"]), current


def purge_expired_keys(saver: _DurableBase) -> int:
    """Delete ledger keys whose TTL ran out (for retention jobs); returns how many."""
    return Ledger(saver).purge_expired()


async def apurge_expired_keys(saver: _DurableBase) -> int:
    return await Ledger(saver).apurge_expired()


