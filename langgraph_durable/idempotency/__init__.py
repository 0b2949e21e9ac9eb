"""``@idempotent``: a side effect happens once, however often its run is resumed.

Checkpointing cannot prevent a repeated effect on its own: a node that dies after its
effect but before its checkpoint runs again from its first line. Each wrapped call is
therefore recorded in a ledger (``durable_ledger``, in the same database as the
checkpoints) under an idempotency key:

1. *claim* the key: ``INSERT ... ON CONFLICT DO NOTHING`` (DBOS style), then read the
   row in the same round trip;
2. if we own it, run the function (``status = 'started'``, a short *claim lease* renewed
   in the background tells other callers the call is alive), then record its serialized
   result (``status = 'completed'``);
3. otherwise decide from the row: replay a recorded result, refuse other arguments
   (``IdempotencyConflictError``, HTTP 422 in the IETF draft), wait for a live claim or
   give up (``CallInFlightError``, 409), or report an expired claim with no result as an
   unknown outcome (``OutcomeUnknownError``; ``on_unknown="retry"`` re-runs it instead).

Transactional mode (``transactional=True``) hands the function a psycopg connection in
the same transaction as the claim and the record, so a database effect and its record
commit together or not at all: no "started" state is ever visible.

The decision logic is written once as generators (the package's sans-I/O style, see
``_io``): one flow per call (``_call_flow``), run by the sync or the async driver;
only the entry point and a ``Mode`` (which driver, which connections) differ.
"""


# The package's modules: keys (call sites, keys, fingerprints), call (options and one
# prepared call), protocol (the ledger protocol and how it runs), decorator, tool, ledger
# (the operator API). Private names other modules use are re-exported here until
# they import them from where they live.
from langgraph_durable.idempotency.decorator import idempotent
from langgraph_durable.idempotency.keys import (
    _PARENT as _PARENT,
)
from langgraph_durable.idempotency.keys import (
    _canonical as _canonical,
)
from langgraph_durable.idempotency.keys import (
    _current_site as _current_site,
)
from langgraph_durable.idempotency.keys import (
    _digest as _digest,
)
from langgraph_durable.idempotency.keys import (
    _dumps as _dumps,
)
from langgraph_durable.idempotency.keys import (
    _Parent as _Parent,
)
from langgraph_durable.idempotency.keys import (
    _Site as _Site,
)
from langgraph_durable.idempotency.ledger import (
    Ledger,
    LedgerEntry,
    apurge_expired_keys,
    purge_expired_keys,
)
from langgraph_durable.idempotency.protocol import (
    ASYNC as ASYNC,
)
from langgraph_durable.idempotency.protocol import (
    SYNC as SYNC,
)
from langgraph_durable.idempotency.protocol import (
    Mode as Mode,
)
from langgraph_durable.idempotency.protocol import (
    _await_checkpoint as _await_checkpoint,
)
from langgraph_durable.idempotency.protocol import (
    _op_one as _op_one,
)
from langgraph_durable.idempotency.protocol import (
    _prepare_threshold as _prepare_threshold,
)
from langgraph_durable.idempotency.protocol import (
    within as within,
)
from langgraph_durable.idempotency.tool import IdempotentTool
from langgraph_durable.sql.ledger import LEDGER_PURGE_EXPIRED_SQL as PURGE_EXPIRED_SQL  # noqa: F401

__all__ = [
    "IdempotentTool",
    "Ledger",
    "LedgerEntry",
    "apurge_expired_keys",
    "idempotent",
    "purge_expired_keys",
]
