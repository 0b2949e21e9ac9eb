"""An accepted update_state is never overwritten by a run that starts while it commits
(issue 11 item 3; found again by tests/test_model_chaos.py under load, 2026-12-02).

update_state outside a run is a put in the foreign-lease mode: its guard refuses when
anyone holds a live lease. The guard used to read the thread row without a lock, so a run
whose lease acquisition committed between that read and the put's commit loaded the head
before the update, ran from it, and wrote a newer head without the update: an update the
caller was told had been stored, silently lost. The guard now holds the row FOR SHARE
until the put commits, so the acquisition (an UPDATE of that row) waits for it and the
run's load, in the acquisition's own transaction after it, sees the update.

The interleaving is made deterministic with a trigger that sleeps inside the update's
INSERT (after its guard has been evaluated), on a real PostgreSQL."""

from __future__ import annotations

import operator
import threading
import time
from collections.abc import Iterator
from typing import Annotated, Any, TypedDict

import psycopg
import pytest
from langgraph.graph import START, StateGraph

from langgraph_durable import DurablePostgresSaver

SLEEP_S = 1.5


class S(TypedDict, total=False):
    log: Annotated[list[str], operator.add]
    note: str


def _builder() -> Any:
    b = StateGraph(S)
    b.add_node("a", lambda s: {"log": ["a"]})
    b.add_edge(START, "a")
    return b


@pytest.fixture
def slow_update(dsn: str) -> Iterator[str]:
    """A trigger that holds an update_state's INSERT of thread 'race' for SLEEP_S."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f"""CREATE OR REPLACE FUNCTION race_slow_update() RETURNS trigger AS $$
            BEGIN
              IF NEW.thread_id = 'race' AND NEW.metadata ->> 'source' = 'update' THEN
                PERFORM pg_sleep({SLEEP_S});
              END IF;
              RETURN NEW;
            END $$ LANGUAGE plpgsql"""
        )
        conn.execute("DROP TRIGGER IF EXISTS race_slow_update ON checkpoints")
        conn.execute(
            "CREATE TRIGGER race_slow_update BEFORE INSERT ON checkpoints "
            "FOR EACH ROW EXECUTE FUNCTION race_slow_update()"
        )
    yield dsn
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP TRIGGER IF EXISTS race_slow_update ON checkpoints")
        conn.execute("DROP FUNCTION IF EXISTS race_slow_update()")


def test_a_run_starting_while_an_update_commits_keeps_the_update(slow_update: str) -> None:
    cfg: Any = {"configurable": {"thread_id": "race"}}
    with DurablePostgresSaver.from_conn_string(slow_update) as runner, \
            DurablePostgresSaver.from_conn_string(slow_update) as editor:
        graph = _builder().compile(checkpointer=runner)
        graph.invoke({"log": []}, cfg)  # the thread exists, with its durable_threads row
        edit = _builder().compile(checkpointer=editor)
        errors: list[BaseException] = []

        def update() -> None:
            try:
                edit.update_state(cfg, {"note": "bb"})
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        t = threading.Thread(target=update)
        t.start()
        time.sleep(SLEEP_S / 3)  # the update's guard has passed; its INSERT sleeps
        started = time.monotonic()
        graph.invoke({"log": []}, cfg)  # a new turn, starting while the update commits
        waited = time.monotonic() - started
        t.join(10)
        assert not errors, errors
        state = graph.get_state(cfg)
        # The update was accepted (update_state returned): no later head may drop it.
        assert state.values.get("note") == "bb", (state.values, f"run took {waited:.2f} s")
        assert state.values["log"] == ["a", "a"]
