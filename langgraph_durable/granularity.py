"""Checkpoint granularity: defer the checkpoints of cheap steps, flush before effects.

LangGraph writes a checkpoint after every superstep (``durability="sync"``/``"async"``)
or once at the end (``"exit"``). Neither lets the cost of re-execution decide. With a
``checkpoint_policy`` the saver keeps the checkpoint of a cheap step in memory instead
of writing it ("deferred"); the next checkpoint supersedes it. A crash resumes from the
last *durable* checkpoint and re-executes the deferred steps: pure computation, never
an effect, because a deferred checkpoint is flushed (written, durably) before:

* an ``@idempotent`` call claims its key and before a journaled model call (both key
  on the task id, which hashes the checkpoint id the task runs from: the checkpoint
  must be stored for a resume to rebuild the same key: see idempotency._await_checkpoint);
* an interrupt is stored, and a subgraph writes its first checkpoint or write (never
  deferred inside a subgraph: only the root namespace defers);
* the run ends (done, error, cancel, a worker's SIGTERM hand-back at a step
  boundary: all go through the run's exit, which flushes before the lease is released);
* the budget would be exceeded (``ReworkBudget``);
* a task that must not run again finishes from it (issue 23): a task whose own
  policy is "always" (or that the saver cannot name), and, under a ``ReworkBudget``,
  any task finishing once the work since the last durable checkpoint exceeds the
  budget. Its writes make the deferred checkpoint durable first (a fenced put), then
  they are stored, as LangGraph stores a finished task's writes without deferral: a
  crash afterwards resumes past the task. This holds for every task that runs from a
  deferred checkpoint (parallel branches, ``Send`` packets, subgraph nodes with or
  without a checkpointer, a task beside an interrupt); its writes arriving before
  their checkpoint (``durability="async"``) make that checkpoint written, not
  deferred, and arriving after it was superseded, flush the deferred checkpoint
  holding their effect.

Stored history stays a chain: a flushed checkpoint's parent is the last durable one,
its blobs are those of every channel whose version differs from that parent's (so
every version it references is stored), and the pending writes of superseded
checkpoints are dropped (their effect on the state is in the checkpoint that
superseded them). Writes of a deferred checkpoint's deferrable tasks are held with it
and written right after it when it is flushed; writes that reach the saver before their
checkpoint (``durability="async"`` submits them in the background) are held until it
arrives.

A failed flush at the run's exit (an unencodable value, the lease lost meanwhile) is
raised from invoke/stream as the put would have raised it without deferral; the
lease is released as failed ('error', counted at the last stored head).

Deferral is refused (the step is written as usual) for: writes outside a leased root
run (``update_state``, tools, the conformance suite's direct calls), ``durability="exit"``
(nothing to do), graphs with a ``DeltaChannel`` (its readers rebuild the value from the
writes stored along the parent chain, which deferral drops), the input checkpoint and
any checkpoint not produced by the loop (``source`` other than ``"loop"``).

Another process's ``get_state`` (and ``get_state`` in this one: it reads the database)
sees the last durable checkpoint, not the deferred head.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import psycopg

from langgraph_durable._io import Flow, Sleep, Tx
from langgraph_durable.errors import ConfigurationError

if TYPE_CHECKING:
    from langgraph_durable.core.base import _DurableBase
    from langgraph_durable.leases.model import Lease

logger = logging.getLogger("langgraph_durable")

NodePolicy = Literal["always", "defer"]
NODE_POLICIES = ("always", "defer")
# The key of LangGraph's node metadata read: add_node(..., metadata={"checkpoint": "defer"}).
METADATA_KEY = "checkpoint"

_INTERRUPT = "__interrupt__"
_RUNTIME_KEY = "__pregel_runtime"
_PULL_PREFIX = "~__pregel_pull, "


@dataclass(frozen=True)
class ReworkBudget:
    """Defer a step's checkpoint while the work since the last durable checkpoint stays
    under ``seconds``: a crash then re-executes at most about that much (the step in
    flight when it happens aside, which a crash re-executes with every policy).

    ``nodes``: per-node overrides ("always" / "defer"), like node metadata."""

    seconds: float = 1.0
    nodes: Mapping[str, NodePolicy] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.seconds, int | float) or not self.seconds > 0:
            raise ConfigurationError(
                f"ReworkBudget(seconds=...) must be a positive number, got {self.seconds!r}"
            )
        _check_nodes(self.nodes)


CheckpointPolicy = NodePolicy | Mapping[str, NodePolicy] | ReworkBudget


def _check_nodes(nodes: Mapping[str, Any]) -> None:
    for name, value in nodes.items():
        if value not in NODE_POLICIES:
            raise ConfigurationError(
                f"checkpoint policy of node {name!r} must be 'always' or 'defer', got {value!r}",
                node=name,
            )


@dataclass
class _Pending:
    config: Any
    checkpoint: Any
    metadata: Any
    # (config, writes, task_id, task_path) of its tasks, in arrival order.
    writes: list[tuple[Any, Sequence[tuple[str, Any]], str, str]] = field(default_factory=list)


@dataclass
class _Run:
    lease: Lease
    loop: Any
    node_policy: dict[str, NodePolicy]
    default: NodePolicy
    budget: float | None
    thread_id: str
    durable_id: str | None
    durable_versions: dict[str, Any]
    durable_at: float
    last_put_at: float
    pending: _Pending | None = None
    durable_ids: set[str] = field(default_factory=set)
    superseded: set[str] = field(default_factory=set)
    demanded: set[str] = field(default_factory=set)
    early: dict[str, list[tuple[Any, Sequence[tuple[str, Any]], str, str]]] = field(default_factory=dict)
    # checkpoint id -> the policies of the tasks that wrote on it (their step).
    step_policies: dict[str, set[str]] = field(default_factory=dict)
    # versions_seen of the last checkpoint put (the parent of the next).
    last_seen: dict[str, Any] = field(default_factory=dict)
    closed: bool = False
    # Ids of deferred checkpoints taken for a flush whose put has not finished: a later
    # put of the thread waits for them (taken under the lock, written outside it: without
    # the wait, the child's put could commit first and the flush then fail the order
    # check, seen with durability="async" and a subgraph's writes flushing the head).
    flushing: set[str] = field(default_factory=set)
    # A flush that failed (review23): (its error, the last durable checkpoint before it).
    # LangGraph runs put_writes in the background and goes on after its failure, so an
    # "always" task's failed flush would leave the run writing children on top of a
    # checkpoint never stored (refused as AcknowledgedWorkLostError, the thread handed
    # back 'stopped', uncounted: resumed for ever, the task re-run each time). Every
    # later write of the run raises it, and the run's exit releases as failed with it.
    failed: tuple[BaseException, str | None] | None = None


@dataclass(frozen=True)
class ExitFlush:
    """A write of the run's exit flush that failed: ``error`` is what the write raised
    (``UnencodableValueError``, ``LeaseLostError``...: what the put would have raised
    without deferral), ``stored_head`` the last checkpoint of the run known stored
    (None: none of this run's)."""

    error: BaseException
    stored_head: str | None


@dataclass
class Stats:
    """Counters of one saver (and its clones): for tests and the benchmark."""

    deferred: int = 0
    flushed: int = 0
    written: int = 0
    writes_dropped: int = 0


class Deferrals:
    """The deferral state of a saver, shared by its ``bind``/``with_allowlist`` clones."""

    def __init__(self, policy: CheckpointPolicy | None) -> None:
        self.default: NodePolicy = "always"
        self.nodes: dict[str, NodePolicy] = {}
        self.budget: float | None = None
        if policy is None:
            pass  # the default: node metadata only; a graph without it is not tracked
        elif isinstance(policy, ReworkBudget):
            self.budget = float(policy.seconds)
            self.nodes = dict(policy.nodes)
            self.default = "defer"
        elif isinstance(policy, str):
            if policy not in NODE_POLICIES:
                raise ConfigurationError(
                    f"checkpoint_policy must be 'always', 'defer', a mapping of node names "
                    f"or a ReworkBudget, got {policy!r}"
                )
            self.default = policy
        elif isinstance(policy, Mapping):
            _check_nodes(policy)
            self.nodes = dict(policy)
        else:
            raise ConfigurationError(
                f"checkpoint_policy must be 'always', 'defer', a mapping of node names or a "
                f"ReworkBudget, got {type(policy).__name__}"
            )
        self.policy = policy
        self.lock = threading.Lock()
        self.runs: dict[str, _Run] = {}
        self.stats = Stats()

    # ------------------------------------------------------------------ run start / end
    def start(self, lease: Lease, ctx: Any, saved: Any) -> None:
        """A root run took ``lease``: track it unless deferral is unsafe or pointless."""
        loop = ctx.loop
        with self.lock:
            self.runs.pop(lease.thread_id, None)
        if getattr(loop, "durability", "async") == "exit":
            return
        node_policy = dict(self.nodes)
        graph = getattr(ctx, "graph", None)
        for name, node in (getattr(graph, "nodes", None) or {}).items():
            wanted = (getattr(node, "metadata", None) or {}).get(METADATA_KEY)
            if wanted in NODE_POLICIES and name not in self.nodes:
                node_policy[name] = wanted  # the saver's mapping wins over metadata
        if self.default != "defer" and "defer" not in node_policy.values():
            return  # nothing in this graph may be deferred: the run is written as usual
        # After the policy check: an isinstance per channel (ABCs) on every run start
        # of the default saver (policy None), whose graphs defer nothing (issue 14).
        if _has_delta_channels(ctx):
            return
        durable_id = saved.checkpoint["id"] if saved is not None else None
        now = time.monotonic()
        run = _Run(
            lease=lease, loop=loop, node_policy=node_policy, default=self.default,
            budget=self.budget, thread_id=lease.thread_id, durable_id=durable_id,
            durable_versions=dict(saved.checkpoint["channel_versions"]) if saved is not None else {},
            durable_at=now, last_put_at=now,
        )
        if durable_id:
            run.durable_ids.add(durable_id)
            run.last_seen = dict(saved.checkpoint.get("versions_seen") or {})
        with self.lock:
            self.runs[lease.thread_id] = run

    def exit_flow(self, saver: _DurableBase, lease: Lease) -> Flow[ExitFlush | None]:
        """At the run's exit (all its puts have arrived: LangGraph's background
        executor is closed before the saver's exit callback): flush what is deferred
        and any writes still waiting for their checkpoint, then stop tracking.

        A failed write is not raised here: it is returned (``ExitFlush``) with the
        last checkpoint of the run known stored, so that the run's exit can release
        the lease as failed at the right head and then raise it (lifecycle)."""
        with self.lock:
            run = self.runs.get(lease.thread_id)
            if run is None or run.lease is not lease:
                return None
            del self.runs[lease.thread_id]
            run.closed = True
            if run.failed is not None:
                return ExitFlush(*run.failed)
            # Before _take_pending marks the deferred head durable: its put may fail.
            stored = run.durable_id
            ops = self._take_pending(run)
            for writes in run.early.values():
                ops.extend(("writes", w) for w in writes)
            run.early.clear()
        for op in ops:
            try:
                yield from self._run_ops(saver, [op])
            except Exception as error:
                return ExitFlush(error, stored)
            if op[0] == "flush":
                _run, (_config, checkpoint, *_rest), _before = op[1]
                stored = checkpoint["id"]
        return None

    # ------------------------------------------------------------------ lookups
    def _run_for(self, saver: _DurableBase, config: Any) -> _Run | None:
        from langgraph_durable.leases.model import _RUN_LEASE

        configurable = config.get("configurable") or {}
        thread_id = str(configurable.get("thread_id"))
        with self.lock:
            run = self.runs.get(thread_id)
        if run is None or run.closed:
            return None
        lease = _RUN_LEASE.get()
        if lease is not run.lease:
            lease = saver._leases.for_runtime(configurable.get(_RUNTIME_KEY), thread_id)
        return run if lease is run.lease and not lease.released else None

    def _policy_of(self, run: _Run, task_id: str, task_path: str) -> str:
        tasks = getattr(run.loop, "tasks", None) or {}
        task = tasks.get(task_id) if isinstance(tasks, Mapping) else None
        name = getattr(task, "name", None)
        if name is None and task_path.startswith(_PULL_PREFIX):
            name = task_path[len(_PULL_PREFIX):].split(",", 1)[0]
        if name is None:
            return "unknown"  # a task we cannot name: never deferred past
        return self._node_policy(run, name)

    @staticmethod
    def _node_policy(run: _Run, name: str) -> str:
        if name == "__start__":
            return "defer"  # reads the input stored in the input checkpoint
        return run.node_policy.get(name, run.default)

    # ------------------------------------------------------------------ decisions (under lock)
    def _take_pending(self, run: _Run) -> list[tuple[str, Any]]:
        """Make the deferred checkpoint durable (state first, then the ops to do it)."""
        pending = run.pending
        if pending is None:
            return []
        run.pending = None
        # Its parent is the last durable checkpoint; its blobs, every channel version
        # that parent does not have (those of the superseded steps included).
        put = (pending.config, pending.checkpoint, pending.metadata, run.durable_id,
               _diff(pending.checkpoint, run.durable_versions))
        flush = (run, put, set(run.flushing))
        run.flushing.add(pending.checkpoint["id"])
        ops: list[tuple[str, Any]] = [("flush", flush), *[("writes", w) for w in pending.writes]]
        self._mark_durable(run, pending.checkpoint)
        self.stats.flushed += 1
        return ops

    def _mark_durable(self, run: _Run, checkpoint: Any) -> None:
        run.durable_id = checkpoint["id"]
        run.durable_ids.add(checkpoint["id"])
        run.durable_versions = dict(checkpoint["channel_versions"])
        run.durable_at = time.monotonic()

    def _may_defer(self, run: _Run, checkpoint: Any, metadata: Any, parent_id: str | None, now: float) -> bool:
        if (metadata or {}).get("source") != "loop" or checkpoint["id"] in run.demanded:
            return False
        if run.durable_id is None or parent_id is None:
            return False
        policies = run.step_policies.pop(parent_id, None) or set()
        # The nodes that ran in the step: those whose writes arrived, and (PULL tasks)
        # those whose versions_seen moved: a node that wrote nothing, or whose writes
        # are still in flight (durability="async"), is seen there.
        for name, seen in (checkpoint.get("versions_seen") or {}).items():
            if run.last_seen.get(name) != seen:
                policies.add(self._node_policy(run, name))
        if not policies or policies != {"defer"}:
            return False
        if run.budget is not None:
            last_step = now - run.last_put_at
            if (now - run.durable_at) + last_step > run.budget:
                return False
        return True

    # ------------------------------------------------------------------ put
    def put_flow(
        self, saver: _DurableBase, config: Any, checkpoint: Any, metadata: Any, new_versions: Any
    ) -> Flow[Any] | None:
        """The flow writing this put, or None when the policy does not concern it
        (the saver then writes it as usual)."""
        run = self._run_for(saver, config)
        if run is None:
            return None
        if run.failed is not None:
            raise run.failed[0]
        configurable = config["configurable"]
        ns = configurable.get("checkpoint_ns", "")
        if ns:
            # A subgraph's checkpoint: never deferred; the root checkpoint its task runs
            # from must be stored first (its metadata names it as a parent).
            root_id = ((metadata or {}).get("parents") or {}).get("")
            with self.lock:
                ops: list[tuple[str, Any]] = self._demand(run, root_id)
            return self._then_put(saver, ops, config, checkpoint, metadata, new_versions) if ops else None
        parent_id = configurable.get("checkpoint_id")
        now = time.monotonic()
        with self.lock:
            inflight = set(run.flushing)
            early = run.early.pop(checkpoint["id"], [])
            defer = self._may_defer(run, checkpoint, metadata, parent_id, now) and not any(
                _interrupts(w[1]) for w in early
            )
            run.last_put_at = now
            run.last_seen = dict(checkpoint.get("versions_seen") or {})
            # Only the child of the deferred checkpoint supersedes it; anything else
            # (not seen from LangGraph: defensive) stores it first, writes and all.
            before: list[tuple[str, Any]] = []
            if run.pending is not None and run.pending.checkpoint["id"] != parent_id:
                before = self._take_pending(run)
            superseded = run.pending is not None and run.pending.checkpoint["id"] == parent_id
            if superseded:
                assert run.pending is not None
                run.superseded.add(run.pending.checkpoint["id"])
                self.stats.writes_dropped += len(run.pending.writes)
                run.pending = None
            if defer:
                run.pending = _Pending(config, checkpoint, metadata, list(early))
                self.stats.deferred += 1
                result = {"configurable": {
                    "thread_id": str(configurable["thread_id"]), "checkpoint_ns": ns,
                    "checkpoint_id": checkpoint["id"],
                }}
                return self._ops_then(saver, before, result) if before else _const(result)
            parent = run.durable_id if superseded else parent_id
            versions = _diff(checkpoint, run.durable_versions) if superseded else new_versions
            self._mark_durable(run, checkpoint)
            self.stats.written += 1
            ops = [*before, ("put", (config, checkpoint, metadata, parent, versions))]
            ops.extend(("writes", w) for w in early)
        return self._put_result(saver, [("wait", (run, inflight)), *ops])

    def _ops_then(self, saver: _DurableBase, ops: list[tuple[str, Any]], value: Any) -> Flow[Any]:
        yield from self._run_ops(saver, ops)
        return value

    def _put_result(self, saver: _DurableBase, ops: list[tuple[str, Any]]) -> Flow[Any]:
        """Run ``ops``; the result is the config of the last put among them."""
        return (yield from self._run_ops(saver, ops))

    def _then_put(
        self, saver: _DurableBase, ops: list[tuple[str, Any]], config: Any, checkpoint: Any,
        metadata: Any, new_versions: Any,
    ) -> Flow[Any]:
        yield from self._run_ops(saver, ops)
        return (yield from _write_tx(saver, config, lambda: saver._op_put(config, checkpoint, metadata, new_versions)))

    def _ops_flow(self, saver: _DurableBase, ops: list[tuple[str, Any]]) -> Flow[Any]:
        return (yield from self._run_ops(saver, ops))

    # ------------------------------------------------------------------ put_writes
    def writes_flow(
        self, saver: _DurableBase, config: Any, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str
    ) -> Flow[None] | None:
        if not writes:
            return None
        run = self._run_for(saver, config)
        if run is None:
            return None
        if run.failed is not None:
            raise run.failed[0]
        configurable = config["configurable"]
        if configurable.get("checkpoint_ns", ""):
            with self.lock:
                ops = self._take_pending(run)
            if not ops:
                return None
            ops.append(("writes", (config, writes, task_id, task_path)))
            return self._ops_flow(saver, ops)
        checkpoint_id = configurable.get("checkpoint_id")
        item = (config, writes, task_id, task_path)
        with self.lock:
            policy = self._policy_of(run, task_id, task_path)
            run.step_policies.setdefault(checkpoint_id, set()).add(policy)
            # A finished task that must not run again after a crash (see _must_store).
            store = self._must_store(run, policy) or _interrupts(writes)
            if checkpoint_id in run.superseded:
                # Its effect is in the checkpoint that superseded it (LangGraph applies
                # a step's writes before it makes the next checkpoint): if that one is
                # still deferred, storing it is what keeps the task from running again.
                self.stats.writes_dropped += 1
                ops = self._take_pending(run) if store else []
                return self._ops_flow(saver, ops) if ops else _const(None)
            if run.pending is not None and run.pending.checkpoint["id"] == checkpoint_id:
                run.pending.writes.append(item)
                if not store:
                    return _const(None)
                # The deferred checkpoint first (fenced, as its put would have been),
                # then its writes, these included: what a crash resumes from.
                return self._ops_flow(saver, self._take_pending(run))
            if checkpoint_id in run.flushing:
                # Its checkpoint is being flushed by another task's writes: after it.
                return self._ops_flow(saver, [("wait", (run, {checkpoint_id})), ("writes", item)])
            if checkpoint_id in run.durable_ids or not checkpoint_id:
                return None
            # Its checkpoint has not reached the saver yet (durability="async"): held
            # until it does; a task that must be stored has it written, not deferred.
            run.early.setdefault(checkpoint_id, []).append(item)
            if store:
                run.demanded.add(checkpoint_id)
            return _const(None)

    def _must_store(self, run: _Run, policy: str) -> bool:
        """Whether a task's writes on a deferred checkpoint must be stored now rather
        than held with it: the task's own policy is not "defer" (a crash must never run
        a finished "always" task again), or, under a ``ReworkBudget``, the finished work
        at risk (since the last durable checkpoint) already exceeds the budget."""
        if policy != "defer":
            return True
        return run.budget is not None and time.monotonic() - run.durable_at > run.budget

    # ------------------------------------------------------------------ effects
    def _demand(self, run: _Run, checkpoint_id: str | None) -> list[tuple[str, Any]]:
        """``checkpoint_id`` must be stored: flush it if deferred, or have it written
        when it arrives. Returns the ops to run now."""
        if checkpoint_id is None or (
            run.pending is not None and run.pending.checkpoint["id"] == checkpoint_id
        ):
            return self._take_pending(run)
        if checkpoint_id not in run.durable_ids:
            # Not arrived yet (durability="async"): written durably when it does, and
            # whatever is deferred now is superseded by it then.
            run.demanded.add(checkpoint_id)
        return []

    def effect_flow(self, saver: _DurableBase, config: Any) -> Flow[None] | None:
        """Before an effect (an ``@idempotent`` claim, a journaled model call) in a
        task of this run: the checkpoint the task runs from, and for a subgraph's task
        the root's deferred checkpoint, must be durable."""
        run = self._run_for(saver, config)
        if run is None:
            return None
        configurable = config.get("configurable") or {}
        runtime = configurable.get(_RUNTIME_KEY)
        info = getattr(runtime, "execution_info", None)
        checkpoint_id = getattr(info, "checkpoint_id", None)
        with self.lock:
            if configurable.get("checkpoint_ns"):
                checkpoint_id = None  # a subgraph task: flush the root's head
            ops = self._demand(run, checkpoint_id)
        return self._ops_flow(saver, ops) if ops else None

    # ------------------------------------------------------------------ I/O
    def _wait_flushes(self, run: _Run, ids: set[str]) -> Flow[None]:
        """Until the flushes of ``ids`` (taken before this op) have written their put."""
        deadline = time.monotonic() + 30.0
        while True:
            with self.lock:
                ids &= run.flushing
            if not ids or time.monotonic() > deadline:
                return
            yield Sleep(0.002)

    def _run_ops(self, saver: _DurableBase, ops: list[tuple[str, Any]]) -> Flow[Any]:
        result: Any = None
        for kind, args in ops:
            if kind == "wait":
                yield from self._wait_flushes(*args)
                continue
            if kind == "flush":
                run, put, before = args
                yield from self._wait_flushes(run, before)
                try:
                    result = yield from self._run_ops(saver, [("put", put)])
                except Exception as error:
                    with self.lock:
                        run.failed = run.failed or (error, put[3])
                    raise
                finally:
                    with self.lock:
                        run.flushing.discard(put[1]["id"])
                continue
            if kind == "put":
                config, checkpoint, metadata, parent, versions = args
                cfg = _with_parent(config, parent)
                out = yield from _write_tx(
                    saver, cfg, lambda c=cfg, cp=checkpoint, md=metadata, v=versions: saver._op_put(c, cp, md, v)
                )
                result = out  # the config of the last put: what put() returns
            else:
                config, writes, task_id, task_path = args
                yield from _write_tx(
                    saver, config,
                    lambda c=config, w=writes, t=task_id, p=task_path: saver._op_put_writes(c, w, t, p),
                )
        return result


def _write_tx(saver: _DurableBase, config: Any, factory: Any) -> Flow[Any]:
    """``saver._write`` as a flow step: an artifact collected meanwhile is written again."""
    try:
        return (yield Tx(factory))
    except psycopg.errors.ForeignKeyViolation:
        saver._known_refs.forget_thread(str(config["configurable"]["thread_id"]))
        return (yield Tx(factory))


def _const(value: Any) -> Flow[Any]:
    return value
    yield  # pragma: no cover - makes this a generator


def _with_parent(config: Any, parent: str | None) -> Any:
    configurable = dict(config["configurable"])
    if parent is None:
        configurable.pop("checkpoint_id", None)
    else:
        configurable["checkpoint_id"] = parent
    return {**config, "configurable": configurable}


def _diff(checkpoint: Any, durable_versions: Mapping[str, Any]) -> dict[str, Any]:
    """The channel versions a flushed checkpoint references that its (durable) parent
    does not: the blobs to write with it."""
    return {k: v for k, v in checkpoint["channel_versions"].items() if durable_versions.get(k) != v}


def _interrupts(writes: Sequence[tuple[str, Any]]) -> bool:
    return any(w[0] == _INTERRUPT for w in writes)


def _has_delta_channels(ctx: Any) -> bool:
    try:
        from langgraph.channels.delta import DeltaChannel  # type: ignore[import-not-found,unused-ignore]
    except ImportError:  # a LangGraph without DeltaChannel
        return False
    specs = getattr(ctx.loop, "specs", None) or getattr(getattr(ctx, "graph", None), "channels", None) or {}
    return any(isinstance(spec, DeltaChannel) for spec in specs.values())


# ---------------------------------------------------------------------- effect hooks
def _current() -> tuple[Any, Any] | None:
    """(saver with a policy, config) of the task running in this context, if any."""
    try:
        from langgraph.config import get_config

        config = get_config()
    except (RuntimeError, ImportError):
        return None
    saver = (config.get("configurable") or {}).get("__pregel_checkpointer")
    if getattr(saver, "_granularity", None) is None:
        return None
    return saver, config


def before_effect() -> None:
    """Called before an effect is claimed (sync drivers): flush what it depends on."""
    found = _current()
    if found is None:
        return
    saver, config = found
    flow = saver._granularity.effect_flow(saver, config)
    if flow is not None:
        saver._run_flow(flow)


async def abefore_effect() -> None:
    found = _current()
    if found is None:
        return
    saver, config = found
    flow = saver._granularity.effect_flow(saver, config)
    if flow is not None:
        await saver._arun_flow(flow)
