"""Every LangGraph name this package relies on that LangGraph does not promise to keep.

The durable savers reuse pure helpers of ``langgraph-checkpoint-postgres`` (its SQL and
the delta-channel walk), a private type of ``langgraph-checkpoint``, and recognise a run
start by finding LangGraph's ``PregelLoop`` on the call stack. A LangGraph release may
rename any of these. Without this module the saver would then fail with a bare
``ImportError`` deep in an import chain, or (for the run-start recognition, which is
looked up at call time) keep running graphs with no leases, fencing, poison counting or
version check. ``check()`` runs when the package is imported and raises
``UnsupportedLangGraphError`` naming the installed versions and every missing name.

The tested range is in pyproject.toml; the README's "Supported versions" says the same.
"""

from __future__ import annotations

import importlib
from importlib import metadata

from langgraph_durable.errors import UnsupportedLangGraphError

# (module, attribute path) for every name the package imports or looks up that is
# private (leading underscore) or an undocumented module-level constant of the stock
# packages. Keep in sync with the imports of saver.py, artifacts.py, retention.py,
# versioning.py and idempotency.py.
REQUIRED: tuple[tuple[str, str], ...] = (
    # langgraph-checkpoint-postgres: SQL text and pure helpers reused by saver.py
    ("langgraph.checkpoint.postgres.base", "BasePostgresSaver"),
    ("langgraph.checkpoint.postgres.base", "MIGRATIONS"),
    ("langgraph.checkpoint.postgres.base", "SELECT_SQL"),
    ("langgraph.checkpoint.postgres.base", "SELECT_PENDING_SENDS_SQL"),
    ("langgraph.checkpoint.postgres.base", "UPSERT_CHECKPOINT_BLOBS_SQL"),
    ("langgraph.checkpoint.postgres.base", "UPSERT_CHECKPOINTS_SQL"),
    ("langgraph.checkpoint.postgres.base", "UPSERT_CHECKPOINT_WRITES_SQL"),
    ("langgraph.checkpoint.postgres.base", "INSERT_CHECKPOINT_WRITES_SQL"),
    ("langgraph.checkpoint.postgres.base", "PRUNE_DELETE_THREADS_SQL"),
    ("langgraph.checkpoint.postgres.base", "PRUNE_DELTA_THREADS_SQL"),
    ("langgraph.checkpoint.postgres.base", "PRUNE_STRATEGIES"),
    ("langgraph.checkpoint.postgres.base", "_DELTA_PAGE_SIZE"),
    ("langgraph.checkpoint.postgres.base", "_DeltaStage2Row"),
    ("langgraph.checkpoint.postgres.base", "_build_delta_stage1_sql"),
    ("langgraph.checkpoint.postgres.base", "_build_delta_stage2_sql"),
    ("langgraph.checkpoint.postgres.base", "_keep_latest"),
    ("langgraph.checkpoint.postgres.base", "_refuse_delta_threads"),
    ("langgraph.checkpoint.postgres.base", "BasePostgresSaver._search_where"),
    ("langgraph.checkpoint.postgres.base", "BasePostgresSaver._ingest_stage1_page"),
    ("langgraph.checkpoint.postgres.base", "BasePostgresSaver._try_advance_walks"),
    ("langgraph.checkpoint.postgres.base", "BasePostgresSaver._build_delta_channels_writes_history"),
    # langgraph-checkpoint
    ("langgraph.checkpoint.serde.types", "_DeltaSnapshot"),
    ("langgraph.checkpoint.serde.types", "TASKS"),
    # langgraph: run-start recognition (lifecycle._find_run_context, _attach_exit)
    ("langgraph.pregel", "Pregel"),
    ("langgraph.pregel._loop", "PregelLoop"),
    ("langgraph.pregel._loop", "PregelLoop._first"),
    ("langgraph.pregel._loop", "SyncPregelLoop.__enter__"),
    ("langgraph.pregel._loop", "AsyncPregelLoop.__aenter__"),
    ("langgraph.pregel._checkpoint", ""),
    ("langgraph._internal._constants", "CONFIG_KEY_RUNTIME"),
    # langgraph: task ids recomputed by migrations (versioning.py), @task detection
    ("langgraph.pregel._algo", "_uuid5_str"),
    ("langgraph.pregel._algo", "_xxhash_str"),
    ("langgraph.pregel._algo", "task_path_str"),
    ("langgraph.func", "_TaskFunction"),
)

# The configurable key LangGraph puts on a run's config (the run's Runtime object;
# lifecycle and leases.fence use it as _RUNTIME_KEY).
RUNTIME_KEY = "__pregel_runtime"
# The configurable key of the run's durability ("sync", "async", "exit"): core.base,
# lifecycle and idempotency.keys read it.
DURABILITY_KEY = "__pregel_durability"


def versions() -> dict[str, str]:
    """Installed versions of the LangGraph packages this package depends on."""
    out = {}
    for dist in ("langgraph", "langgraph-checkpoint", "langgraph-checkpoint-postgres"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def langgraph_version() -> str:
    return versions()["langgraph"]


def describe_versions() -> str:
    return ", ".join(f"{k} {v}" for k, v in versions().items())


def missing_names() -> list[str]:
    """``module:attr`` of every required name that the installed LangGraph lacks."""
    missing = []
    for module_name, path in REQUIRED:
        try:
            obj: object = importlib.import_module(module_name)
        except ImportError:
            missing.append(f"{module_name} (module)")
            continue
        for part in path.split(".") if path else ():
            if not hasattr(obj, part):
                missing.append(f"{module_name}:{path}")
                break
            obj = getattr(obj, part)
    try:
        from langgraph._internal._constants import CONFIG_KEY_DURABILITY, CONFIG_KEY_RUNTIME

        if CONFIG_KEY_RUNTIME != RUNTIME_KEY:
            missing.append(f"langgraph._internal._constants:CONFIG_KEY_RUNTIME == {RUNTIME_KEY!r}")
        if CONFIG_KEY_DURABILITY != DURABILITY_KEY:
            missing.append(f"langgraph._internal._constants:CONFIG_KEY_DURABILITY == {DURABILITY_KEY!r}")
    except ImportError:
        pass  # reported above
    return missing


def check() -> None:
    """Raise ``UnsupportedLangGraphError`` when a required name is missing."""
    missing = missing_names()
    if missing:
        raise UnsupportedLangGraphError(
            f"langgraph-durable does not support the installed LangGraph ({describe_versions()}): "
            f"it relies on {', '.join(missing)}, which this release does not have. Install "
            "a LangGraph version in the range langgraph-durable declares (pip install "
            "langgraph-durable resolves one), or upgrade langgraph-durable.",
            langgraph_version=langgraph_version(),
            what="missing: " + ", ".join(missing),
        )
