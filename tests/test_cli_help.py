"""What a person reads in the CLI (issue 24, item 8): help that does not break sentences,
flags without value placeholders, errors printed as text (not rich markup), and tables that
are neither cropped at 80 columns on a terminal nor at all when piped."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from typing import TypedDict

import pytest
from langgraph.graph import START, StateGraph
from typer.testing import CliRunner

from langgraph_durable import DurablePostgresSaver
from langgraph_durable.cli import app
from langgraph_durable.cli._common import fail

runner = CliRunner()
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
CLI = [sys.executable, "-c", "from langgraph_durable.cli import main; main()"]


def test_every_command_summary_is_one_line() -> None:
    res = runner.invoke(app, ["--help"], env={"COLUMNS": "300"})
    assert res.exit_code == 0
    # retain's first paragraph is three lines in its docstring: one row at a wide terminal
    assert re.search(r"retain +Apply retention: delete completed threads older than --days "
                     r"\(default 30\), and with --keep-last K keep only", res.output)
    assert re.search(r"export-stock +Rewrite threads into plain stock rows \(artifacts inlined, "
                     r"envelopes removed\) so the stock PostgresSaver", res.output)
    assert re.search(r"grants +Print the GRANTs a role needs: DML for the application and "
                     r"workers \(default\), SELECT only", res.output)


@pytest.mark.parametrize("command", [["threads", "list"], ["retain"], ["export-stock"], ["worker"]])
def test_flags_show_no_value_placeholder(command: list[str]) -> None:
    res = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0
    assert "<bool>" not in res.output
    assert re.search(r"--json +Print JSON", res.output) or command == ["worker"]
    assert re.search(r"--help +Show this message", res.output)


def test_pool_size_shows_its_real_default() -> None:
    res = runner.invoke(app, ["worker", "--help"], env={"COLUMNS": "200"})
    row = next(line for line in res.output.splitlines() if "--pool-size" in line)
    assert "max(10, concurrency + 2)" in row and "[default: 0]" not in res.output


def test_an_error_prints_brackets_as_text(capsys: pytest.CaptureFixture[str]) -> None:
    exit_ = fail(False, "X", "needs the 'console' extra: pip install 'langgraph-durable[console]'", {})
    assert exit_.exit_code == 1
    err = capsys.readouterr().err
    assert "pip install 'langgraph-durable[console]'" in err


class S(TypedDict, total=False):
    n: int


def _threads(dsn: str, ids: list[str]) -> None:
    g = StateGraph(S)
    g.add_node("a", lambda s: {"n": 1})
    g.add_edge(START, "a")
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        graph = g.compile(checkpointer=saver)
        for tid in ids:
            graph.invoke({"n": 0}, {"configurable": {"thread_id": tid}})


LONG = "customer-" + "x" * 40 + "-order-0042"


def test_threads_list_piped_is_not_cropped(dsn: str) -> None:
    _threads(dsn, [LONG])
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    out = subprocess.run([*CLI, "threads", "list", "--dsn", dsn], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    row = next(line for line in out.stdout.splitlines() if LONG in line)
    assert row.rstrip().endswith("ago │"), row  # the last column ("last activity") is all there
    assert "fp-" in row and "…" not in row  # piped: nothing shortened


def _in_a_terminal(args: list[str], columns: int) -> str:
    pid, fd = pty.fork()
    if pid == 0:  # the child: a terminal of `columns` columns
        env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
        os.execvpe(args[0], args, env)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    chunks: list[bytes] = []
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    os.waitpid(pid, 0)
    return ANSI.sub("", b"".join(chunks).decode(errors="replace"))


def _screen_lines(args: list[str], columns: int) -> list[str]:
    screen = _in_a_terminal(args, columns)
    return [line.rstrip("\r") for line in screen.splitlines() if line.strip()]


def test_threads_list_fits_an_80_column_terminal(dsn: str) -> None:
    _threads(dsn, ["order-7", LONG])
    # The window size is set right after the fork, before the child's Python has started.
    lines = _screen_lines([*CLI, "threads", "list", "--dsn", dsn, "--prefix", "order-"], 80)
    assert all(len(line) <= 80 for line in lines), lines
    row = next(line for line in lines if "order-7" in line)
    assert row.rstrip().endswith("ago │"), lines  # all columns, the last one complete
    # A 60-character id: whole columns are left out, never the id or the table's edge.
    lines = _screen_lines([*CLI, "threads", "list", "--dsn", dsn], 80)
    assert all(len(line) <= 80 for line in lines), lines
    row = next(line for line in lines if LONG in line)
    assert row.rstrip().endswith("│") and "done" in row, lines
