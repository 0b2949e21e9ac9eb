"""The README's example (examples/quickstart.py) is the file this test runs: SIGKILLed right after
its payment, resumed in a new process, the card charged once. The same agent on the stock saver,
killed at the same point, charges it twice (the failure the package exists to prevent)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "quickstart.py"

# The stock saver with the same graph: the example's builder compiled on PostgresSaver, with the
# undecorated payment function (an @idempotent call needs a durable saver's ledger: NoLedgerError).
STOCK = """
import os, sys
sys.path.insert(0, {examples!r})
import quickstart
quickstart.charge_card = quickstart.charge_card.__wrapped__
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.postgres import PostgresSaver
with PostgresSaver.from_conn_string(os.environ["LANGGRAPH_DURABLE_DSN"]) as saver:
    saver.setup()
    graph = quickstart.builder.compile(checkpointer=saver)
    config = {{"configurable": {{"thread_id": os.environ["THREAD"]}}}}
    resume = saver.get_tuple(config) is not None
    graph.invoke(None if resume else {{"messages": [HumanMessage("buy it")]}}, config)
"""


def _run(args: list[str], dsn: str, thread: str, crash: bool) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LANGGRAPH_DURABLE_DSN": dsn, "THREAD": thread}
    env.pop("CRASH", None)
    if crash:
        env["CRASH"] = "1"
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=120)


def test_readme_shows_the_example_verbatim() -> None:
    readme = (ROOT / "README.md").read_text()
    body = EXAMPLE.read_text().split('"""', 2)[2].strip()  # the code after the module docstring
    assert body in readme, "README.md's example must be examples/quickstart.py, which this file runs"


def test_killed_after_the_charge_then_resumed_charges_once(dsn: str) -> None:
    thread = f"order-{uuid.uuid4().hex[:8]}"
    first = _run([str(EXAMPLE)], dsn, thread, crash=True)
    assert first.returncode == -signal.SIGKILL, first.stderr
    assert first.stdout.count("CHARGED") == 1
    second = _run([str(EXAMPLE)], dsn, thread, crash=False)
    assert second.returncode == 0, second.stderr
    assert second.stdout.count("CHARGED") == 0, "the resumed run charged the card again"
    assert "resumed: Paid: receipt-4242-500" in second.stdout


def test_the_stock_saver_charges_twice(dsn: str) -> None:
    code = STOCK.format(examples=str(EXAMPLE.parent))
    thread = f"stock-{uuid.uuid4().hex[:8]}"
    first = _run(["-c", code], dsn, thread, crash=True)
    assert first.returncode == -signal.SIGKILL, first.stderr
    second = _run(["-c", code], dsn, thread, crash=False)
    assert second.returncode == 0, second.stderr
    assert first.stdout.count("CHARGED") + second.stdout.count("CHARGED") == 2
