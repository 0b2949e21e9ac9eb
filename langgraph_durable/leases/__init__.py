"""Leases: the model (``Lease``, the run's lease in context, the hand-off from a recovery
worker), owner ids, the one renewer thread, the fence and the acquire/release ops.

A run holds its thread through a lease on ``durable_threads`` (``sql.threads``); every
write of the run is fenced by its token (``leases.fence``)."""

from __future__ import annotations

from langgraph_durable.leases.model import Lease, claim_handoff
from langgraph_durable.leases.owners import new_owner_id, owner_is_dead, process_identity

__all__ = ["Lease", "claim_handoff", "new_owner_id", "owner_is_dead", "process_identity"]
