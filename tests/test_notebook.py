"""notebooks/quickstart.ipynb runs top to bottom, so it never rots.

The notebook is executed by nbclient in a real Jupyter kernel (``python3``: the
interpreter running the tests) against a fresh test database passed through
``LANGGRAPH_DURABLE_DSN``. It spawns and SIGKILLs real child processes, and asserts its
own results as it goes; this test checks that every cell ran, that the key results were
printed and plotted, and that the database holds what the notebook says it did.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import require_or_skip
from psycopg.rows import dict_row

pytestmark = pytest.mark.notebook

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "quickstart.ipynb"
CELL_TIMEOUT = 180  # seconds; a hang fails the test instead of blocking the suite


def _require(*modules: str) -> None:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        msg = f"missing test dependencies: {', '.join(missing)}"
        require_or_skip(f"notebook kernel: {msg}")


def _outputs(nb: Any, kind: str) -> list[Any]:
    return [
        o
        for cell in nb.cells
        if cell.cell_type == "code"
        for o in cell.outputs
        if o.output_type == kind
    ]


@pytest.fixture(scope="module")
def executed(dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    _require("nbformat", "nbclient", "ipykernel", "matplotlib")
    import nbformat
    from nbclient import NotebookClient

    workdir = tmp_path_factory.mktemp("notebook")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(
        nb,
        kernel_name="python3",
        timeout=CELL_TIMEOUT,
        resources={"metadata": {"path": str(workdir)}},
    )
    env = {
        **os.environ,
        "LANGGRAPH_DURABLE_DSN": dsn,
        "LANGGRAPH_DURABLE_HOME": str(workdir / "home"),  # never the user's embedded server
        "MPLBACKEND": "module://matplotlib_inline.backend_inline",
    }
    client.execute(env=env)  # raises CellExecutionError at the first failing cell
    return nb


def _stdout(nb: Any) -> str:
    return "".join(o.text for o in _outputs(nb, "stream") if o.name == "stdout")


def test_every_cell_ran_without_error(executed: Any) -> None:
    code_cells = [c for c in executed.cells if c.cell_type == "code"]
    assert code_cells and all(c.execution_count for c in code_cells)
    assert _outputs(executed, "error") == []
    assert "closed" in _stdout(executed)  # the last cell


def test_key_results_are_printed(executed: Any) -> None:
    out = _stdout(executed)
    assert "child killed (exit code -9)" in out
    assert "resumed: 6 steps, each exactly once" in out
    assert "refused: GraphVersionMismatchError (stored 'v1', running 'v2')" in out
    assert "migrated: v1 -> v2" in out
    assert "charges without @idempotent: 2" in out
    assert "charges with @idempotent: 1" in out
    assert "quarantined: PoisonCheckpointError after 2 attempts" in out
    assert "smaller)" in out and "after 40 turns: stock" in out


def test_storage_plot_is_rendered(executed: Any) -> None:
    images = [o for o in _outputs(executed, "display_data") if "image/png" in o.get("data", {})]
    assert len(images) == 1
    assert len(images[0]["data"]["image/png"]) > 1000  # base64 of a real figure


def test_database_holds_what_the_notebook_reports(executed: Any, dsn: str) -> None:
    with psycopg.connect(dsn, row_factory=dict_row) as conn:

        def one(sql: str) -> dict[str, Any]:
            rows = conn.execute(sql).fetchall()
            assert len(rows) == 1, (sql, rows)
            return rows[0]

        # 1. the killed pipeline was taken over (token 2) and finished
        row = one(
            "SELECT status, lease_token, lease_owner FROM durable_threads WHERE thread_id LIKE 'pipeline-%'"
        )
        assert row == {"status": "done", "lease_token": 2, "lease_owner": None}
        # 2. the paused v1 checkpoint was migrated in place
        row = one(
            "SELECT metadata ->> 'graph_version' AS v FROM checkpoints "
            "WHERE thread_id LIKE 'order-%' AND metadata ->> 'migrated_from' = 'v1'"
        )
        assert row["v"] == "v2"
        # 3. one payment with @idempotent, two without, despite the same crash
        charges = {
            r["order_id"].split("-")[1]: r["n"]
            for r in conn.execute(
                "SELECT order_id, count(*) AS n FROM quickstart_payments GROUP BY order_id"
            ).fetchall()
        }
        assert charges == {"plain": 2, "guarded": 1}
        # 4. the poisoned thread is quarantined after 2 attempts
        row = one(
            "SELECT attempts, last_error FROM durable_quarantine WHERE thread_id LIKE 'invoice-%'"
        )
        assert row["attempts"] == 2 and "502 Bad Gateway" in row["last_error"]
        row = one("SELECT status FROM durable_threads WHERE thread_id LIKE 'invoice-%'")
        assert row["status"] == "quarantined"
        # 5. the stock saver wrote to its own schema, the package to the default one
        stock = one(
            "SELECT count(*) AS n FROM quickstart_stock.checkpoints WHERE thread_id LIKE 'chat-%'"
        )
        ours = one("SELECT count(*) AS n FROM public.checkpoints WHERE thread_id LIKE 'chat-%'")
        assert stock["n"] == ours["n"] > 40
