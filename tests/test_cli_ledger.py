"""The ledger CLI (`ledger list|show|resolve|forget|purge-expired`) on real ledger rows
made by `@idempotent` calls: completed, failed (cached), in flight, calls made inside a
graph, and unknown outcomes (a call interrupted mid-way: its claim stays 'started' with
its lease expired and no result). Every command is checked in its rich form and with
--json, and its effect through the next call of the wrapped function."""

from __future__ import annotations

import json
import operator
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Annotated, Any, TypedDict

import psycopg
import pytest
from langgraph.graph import END, START, StateGraph
from typer.testing import CliRunner

from langgraph_durable import (
    DurablePostgresSaver,
    Ledger,
    OutcomeUnknownError,
    idempotent,
)
from langgraph_durable.cli import app

runner = CliRunner()


def run(dsn: str, *args: str) -> Any:
    return runner.invoke(app, ["ledger", *args, "--dsn", dsn])


def run_json(dsn: str, *args: str, code: int = 0) -> Any:
    result = run(dsn, *args, "--json")
    assert result.exit_code == code, result.output
    return json.loads(result.stdout)


class State(TypedDict, total=False):
    receipts: Annotated[list[str], operator.add]


class Rows:
    """The ledger rows the module's tests work on, and the functions that made them."""

    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:8]
        self.keys = {
            n: f"cli-{n}-{tag}"
            for n in ("done", "failed", "failed2", "unk_a", "unk_b", "unk_c", "live", "ttl", "op")
        }
        self.thread = f"cli-thread-{tag}"
        self.runs: dict[str, list[str]] = {}
        self.charges: dict[str, Callable[[str], Any]] = {}
        self.declined: Callable[[int], int] | None = None


def _interrupted_call(saver: DurablePostgresSaver, key: str, runs: list[str]) -> Callable[[str], Any]:
    """A wrapped call whose first attempt is interrupted mid-call (the effect may have
    happened): its claim stays 'started' and its lease is expired at once, so the next
    call sees an unknown outcome."""

    @idempotent(ledger=saver, key=lambda order: key, name="charge")
    def charge(order: str) -> dict[str, Any]:
        runs.append(order)
        if len(runs) == 1:
            raise KeyboardInterrupt  # a Ctrl-C / cancellation right after the effect
        return {"charged": order, "by": "function"}

    with pytest.raises(KeyboardInterrupt):
        charge("o-1")
    return charge


@pytest.fixture(scope="module")
def rows(dsn: str) -> Iterator[Rows]:
    r = Rows()
    keys = r.keys
    with DurablePostgresSaver.from_conn_string(dsn) as saver:

        @idempotent(ledger=saver, key=lambda to: keys["done"], name="send_email")
        def send(to: str) -> dict[str, Any]:
            return {"id": 7, "to": to}

        fails: list[int] = []

        def make_declined(key: str) -> Callable[[int], int]:
            @idempotent(ledger=saver, key=lambda x: key, name="declined", cache_failures=ValueError)
            def declined(x: int) -> int:
                fails.append(x)
                raise ValueError("card declined")

            return declined

        @idempotent(ledger=saver, key=lambda: keys["ttl"], name="short", ttl=3600)
        def short() -> int:
            return 1

        assert send("a@example.com")["id"] == 7
        for name in ("failed", "failed2"):
            declined = make_declined(keys[name])
            with pytest.raises(ValueError):
                declined(1)
        r.declined = declined  # keyed on failed2
        r.runs["fails"] = fails  # type: ignore[assignment]
        short()
        for name in ("unk_a", "unk_b", "unk_c"):
            r.runs[name] = []
            r.charges[name] = _interrupted_call(saver, keys[name], r.runs[name])

        # Two calls inside a graph run: a derived key (belongs to the thread) and an
        # operation key (first used by the thread).
        @idempotent
        def derived(x: int) -> str:
            return f"d{x}"

        @idempotent(key=lambda x: keys["op"])
        def keyed(x: int) -> str:
            return f"k{x}"

        builder = StateGraph(State)
        builder.add_node("n", lambda s: {"receipts": [derived(1), keyed(2)]})
        builder.add_edge(START, "n")
        builder.add_edge("n", END)
        graph = builder.compile(checkpointer=saver)
        graph.invoke({"receipts": []}, {"configurable": {"thread_id": r.thread}})

        # A call in flight in another thread of this process (its claim lease is live).
        started, release = threading.Event(), threading.Event()

        @idempotent(ledger=saver, key=lambda: keys["live"], name="slow", claim_ttl=30)
        def slow() -> str:
            started.set()
            release.wait(30)
            return "slow"

        worker = threading.Thread(target=slow)
        worker.start()
        assert started.wait(10)
        try:
            yield r
        finally:
            release.set()
            worker.join(30)


def _by_key(entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {e["key"]: e for e in entries}


def test_list_shows_every_state_and_filters(rows: Rows, dsn: str) -> None:
    keys = rows.keys
    everything = _by_key(run_json(dsn, "list"))
    assert {everything[keys[n]]["state"] for n in ("unk_a", "unk_b", "unk_c")} == {"unknown_outcome"}
    assert everything[keys["done"]]["state"] == "completed"
    assert everything[keys["failed"]]["state"] == "failed"
    assert everything[keys["failed"]]["error_type"] == "ValueError"
    assert everything[keys["live"]]["state"] == "in_flight"
    assert everything[keys["live"]]["in_flight"] is True
    assert everything[keys["ttl"]]["expires_at"] is not None
    unk = everything[keys["unk_a"]]
    assert unk["status"] == "started" and unk["outcome_unknown"] and unk["name"] == "charge"
    assert "o-1" in unk["args_preview"]

    started = _by_key(run_json(dsn, "list", "--status", "started"))
    assert {keys[n] for n in ("unk_a", "unk_b", "unk_c", "live")} <= set(started)
    assert {e["status"] for e in started.values()} == {"started"}
    completed = run_json(dsn, "list", "--status", "completed")
    assert keys["done"] in _by_key(completed) and keys["unk_a"] not in _by_key(completed)

    in_thread = run_json(dsn, "list", "--thread", rows.thread)
    assert len(in_thread) == 2
    assert keys["op"] in _by_key(in_thread)
    assert {e["thread_id"] for e in in_thread} == {rows.thread, None}
    assert len(run_json(dsn, "list", "--limit", "2")) == 2
    assert run_json(dsn, "list", "--thread", "no-such-thread") == []

    rich = run(dsn, "list")
    assert rich.exit_code == 0, rich.output
    assert keys["unk_a"] in rich.output and "UNKNOWN" in rich.output
    assert "in flight" in rich.output and "3 unknown outcome(s)" in rich.output
    assert keys["done"] in rich.output and keys["op"] in rich.output
    assert "no ledger entries" in run(dsn, "list", "--thread", "no-such-thread").output
    bad = run(dsn, "list", "--status", "bogus")
    assert bad.exit_code == 2 and "bogus" in bad.output


def test_show_each_state(rows: Rows, dsn: str) -> None:
    keys = rows.keys
    done = run_json(dsn, "show", keys["done"])
    assert done["state"] == "completed" and done["result"] == {"id": 7, "to": "a@example.com"}
    assert done["result_error"] is None and done["name"] == "send_email"
    failed = run_json(dsn, "show", keys["failed"])
    assert failed["state"] == "failed" and "declined" in failed["error"]
    assert "result" not in failed
    unknown = run_json(dsn, "show", keys["unk_a"])
    assert unknown["state"] == "unknown_outcome" and unknown["attempts"] == 1

    rich = run(dsn, "show", keys["unk_a"])
    assert rich.exit_code == 0, rich.output
    assert "unknown_outcome" in rich.output and "ledger resolve" in rich.output
    assert "ledger forget" in rich.output and "o-1" in rich.output
    rich_done = run(dsn, "show", keys["done"])
    assert rich_done.exit_code == 0 and '"to": "a@example.com"' in rich_done.output
    assert "card declined" in run(dsn, "show", keys["failed"]).output
    assert "live process" in run(dsn, "show", keys["live"]).output

    missing = run(dsn, "show", "no-such-key")
    assert missing.exit_code == 1 and "not in the ledger" in missing.output
    err = run_json(dsn, "show", "no-such-key", code=1)
    assert err == {
        "error": "IdempotencyError",
        "message": "idempotency key 'no-such-key' is not in the ledger",
        "key": "no-such-key",
    }


def test_resolve_records_the_verified_result_and_the_next_call_replays_it(
    rows: Rows, dsn: str
) -> None:
    keys = rows.keys
    charge, runs = rows.charges["unk_a"], rows.runs["unk_a"]
    with pytest.raises(OutcomeUnknownError) as err:
        charge("o-1")
    assert err.value.key == keys["unk_a"] and runs == ["o-1"]

    out = run_json(
        dsn, "resolve", keys["unk_a"], "--result-json", '{"charged": "o-1", "by": "operator"}'
    )
    assert out["resolved"] is True and out["state"] == "completed"
    assert out["result"] == {"charged": "o-1", "by": "operator"}
    assert charge("o-1") == {"charged": "o-1", "by": "operator"}
    assert runs == ["o-1"]  # replayed, not run

    charge_b, runs_b = rows.charges["unk_b"], rows.runs["unk_b"]
    rich = run(dsn, "resolve", keys["unk_b"], "--result-json", '["r-1", 2]')
    assert rich.exit_code == 0, rich.output
    assert f"resolved {keys['unk_b']}" in rich.output and "replays" in rich.output
    assert charge_b("o-1") == ["r-1", 2] and runs_b == ["o-1"]
    assert run_json(dsn, "show", keys["unk_b"])["result"] == ["r-1", 2]


def test_resolve_refuses_clearly(rows: Rows, dsn: str) -> None:
    keys = rows.keys
    again = run(dsn, "resolve", keys["done"], "--result-json", "1")
    assert again.exit_code == 1 and "already completed" in again.output
    err = run_json(dsn, "resolve", keys["done"], "--result-json", "1", code=1)
    assert err["error"] == "IdempotencyError" and err["key"] == keys["done"]

    live = run_json(dsn, "resolve", keys["live"], "--result-json", '"x"', code=1)
    assert live["error"] == "CallInFlightError" and live["key"] == keys["live"]
    assert run(dsn, "resolve", keys["live"], "--result-json", '"x"').exit_code == 1

    missing = run(dsn, "resolve", "no-such-key", "--result-json", "1")
    assert missing.exit_code == 1 and "not in the ledger" in missing.output

    bad = run(dsn, "resolve", keys["unk_c"], "--result-json", "{not json")
    assert bad.exit_code == 1 and "not valid JSON" in bad.output
    bad_json = run_json(dsn, "resolve", keys["unk_c"], "--result-json", "{not json", code=1)
    assert bad_json["error"] == "JSONDecodeError"
    assert run_json(dsn, "show", keys["unk_c"])["state"] == "unknown_outcome"  # untouched


def test_forget_rearms_the_key(rows: Rows, dsn: str) -> None:
    keys = rows.keys
    charge, runs = rows.charges["unk_c"], rows.runs["unk_c"]
    out = run_json(dsn, "forget", keys["unk_c"])
    assert out == {"forgotten": True, "key": keys["unk_c"], "was": "unknown_outcome"}
    assert charge("o-1") == {"charged": "o-1", "by": "function"}
    assert runs == ["o-1", "o-1"]  # the function ran again

    # A recorded failure: forgetting it lets the next call run the function.
    fails = rows.runs["fails"]
    before = len(fails)
    rich = run(dsn, "forget", keys["failed2"])
    assert rich.exit_code == 0, rich.output
    assert f"forgot {keys['failed2']} (was failed)" in rich.output
    assert rows.declined is not None
    with pytest.raises(ValueError):
        rows.declined(1)
    assert len(fails) == before + 1

    live = run(dsn, "forget", keys["live"])
    assert live.exit_code == 1 and "in flight" in live.output
    assert run_json(dsn, "forget", keys["live"], code=1)["error"] == "CallInFlightError"
    missing = run_json(dsn, "forget", "no-such-key", code=1)
    assert missing["error"] == "IdempotencyError" and "not in the ledger" in missing["message"]
    assert run(dsn, "forget", "no-such-key").exit_code == 1


def test_purge_expired(rows: Rows, dsn: str) -> None:
    keys = rows.keys
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE durable_ledger SET expires_at = now() - interval '1 second' WHERE key = %s",
            (keys["ttl"],),
        )
    assert run_json(dsn, "purge-expired") == {"purged": 1}
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        assert Ledger(saver).get(keys["ttl"]) is None
        assert Ledger(saver).get(keys["done"]) is not None
    rich = run(dsn, "purge-expired")
    assert rich.exit_code == 0 and "purged 0 expired key(s)" in rich.output


def test_schema_option_and_a_bad_schema(dsn: str) -> None:
    bad = run(dsn, "list", "--schema", "no such schema!")
    assert bad.exit_code == 1
    err = run_json(dsn, "list", "--schema", "no such schema!", code=1)
    assert err["error"] == "InvalidIdentifierError"
