"""The operator console (``langgraph-durable ui``): a web view of the fleet over the
package's operator APIs. Needs the ``console`` extra (starlette, uvicorn, jinja2,
python-multipart); see docs/console.md."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from langgraph_durable.saver import DurablePostgresSaver

__all__ = ["create_app"]


def create_app(saver: DurablePostgresSaver, **options: Any) -> Starlette:
    """See ``langgraph_durable.console._app.create_app``."""
    from langgraph_durable.console._app import create_app as _create

    return _create(saver, **options)
