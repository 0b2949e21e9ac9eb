"""The CLI starts without the heavy imports (issue 14, problem 5).

`langgraph-durable --help` used to import langgraph, langchain-core, psycopg and rich
(~1 s of CPU). Typer needs only the command signatures; the rest loads inside the
command that uses it. Checked by the modules a fresh interpreter has loaded, not by
timing.
"""

from __future__ import annotations

import json
import subprocess
import sys

import langgraph_durable

HEAVY = ("langgraph", "langchain_core", "psycopg", "rich", "zstandard", "langgraph_durable.saver")


def _loaded_after(code: str) -> set[str]:
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", probe], check=True, capture_output=True, text=True
    ).stdout
    return set(json.loads(out.strip().splitlines()[-1]))


def _heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


def test_importing_the_cli_loads_no_heavy_module() -> None:
    assert _heavy(_loaded_after("import langgraph_durable.cli")) == []


def test_help_loads_no_heavy_module_but_typers_rich_help() -> None:
    code = (
        "import sys\nfrom langgraph_durable.cli import app\n"
        "try:\n    app(['--help'])\nexcept SystemExit:\n    pass"
    )
    loaded = _loaded_after(code)
    # typer renders --help with rich when it is installed; nothing else may load.
    assert [m for m in _heavy(loaded) if not m.startswith("rich")] == []


def test_the_entry_point_s_help_loads_no_heavy_module() -> None:
    """What the installed ``langgraph-durable`` script runs: ``main()``, which sets up
    auditing before the app. It once reached ``audit`` through the package's lazy
    attribute, whose LangGraph check imported langgraph (~1 s before --help printed)."""
    code = (
        "import sys\nfrom langgraph_durable.cli import main\n"
        "sys.argv = ['langgraph-durable', '--help']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass"
    )
    loaded = _loaded_after(code)
    assert "langgraph_durable.audit" in loaded
    assert [m for m in _heavy(loaded) if not m.startswith("rich")] == []


def test_every_public_name_still_resolves() -> None:
    for name in langgraph_durable.__all__:
        assert getattr(langgraph_durable, name) is not None, name
    from langgraph_durable import DurablePostgresSaver, poison

    assert DurablePostgresSaver.__module__ == "langgraph_durable.saver"
    assert poison.__name__ == "langgraph_durable.ops.poison"
    assert set(langgraph_durable.__all__) <= set(dir(langgraph_durable))
