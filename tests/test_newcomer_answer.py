"""Newcomer review (issue 25): a thread answered once (queued, the answer stored for the
workers) and answered again, or resumed, from the CLI, the API or the console.

On main the console's thread page kept the answer box, its confirmation page showed the
second answer as "waiting -> answered", and the POST (like ``threads answer`` and
``control.queue_answer``) was refused with "it does not wait on an interrupt", which is
false (it does; an answer is queued) and says nothing of what to do; the console refused
a resume with "answer it instead" at the same time."""

# No `from __future__ import annotations`: LangGraph evaluates the local state schemas.

from typing import Any, TypedDict

import pytest
from langgraph.graph import START, StateGraph
from langgraph.types import interrupt
from starlette.testclient import TestClient
from typer.testing import CliRunner

from langgraph_durable import DurablePostgresSaver
from langgraph_durable.cli import app
from langgraph_durable.console import create_app
from langgraph_durable.errors import ControlRefusedError
from langgraph_durable.ops import control

TOKEN = "newcomer-token-0123456789abcdef"


class S(TypedDict, total=False):
    approved: Any


def _graph() -> Any:
    def ask(state: S) -> dict[str, Any]:
        return {"approved": interrupt({"question": "approve?"})}

    b = StateGraph(S)
    b.add_node("ask", ask)
    b.add_edge(START, "ask")
    return b


@pytest.fixture(scope="module")
def answered(dsn: str) -> str:
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        g = _graph().compile(checkpointer=saver)
        g.invoke({}, {"configurable": {"thread_id": "nc-ans"}})
        control.queue_answer(saver, "nc-ans", {"approved": True})
    return dsn


def test_api_and_cli_say_an_answer_is_queued(answered: str) -> None:
    with DurablePostgresSaver.from_conn_string(answered) as saver:
        for call in (lambda: control.queue_answer(saver, "nc-ans", {"approved": False}),
                     lambda: control.queue_resume(saver, "nc-ans")):
            with pytest.raises(ControlRefusedError) as err:
                call()
            # On main: "it does not wait on an interrupt" (answer); resume re-queued silently.
            assert "already queued" in err.value.fields["reason"], err.value
    result = CliRunner().invoke(app, ["threads", "answer", "nc-ans", '{"approved": false}', "--dsn", answered])
    assert result.exit_code == 1 and "already queued" in result.output, result.output


def test_console_refuses_a_second_answer_on_its_page(answered: str) -> None:
    with DurablePostgresSaver.from_conn_string(answered) as saver:
        with TestClient(create_app(saver, allow_actions=True, token=TOKEN, sample_interval=0)) as client:
            assert client.post("/login", data={"token": TOKEN, "name": "nc"}, follow_redirects=False).status_code == 303
            again = client.get("/confirm/answer?thread=nc-ans&value=%7B%22approved%22%3A%20false%7D")
            resume = client.get("/confirm/resume?thread=nc-ans")
    # On main: 200 (the confirmation offered), the POST then refused as "does not wait".
    assert again.status_code == 409 and "already queued" in again.text, again.text[:300]
    assert resume.status_code == 409 and "already queued" in resume.text, resume.text[:300]
