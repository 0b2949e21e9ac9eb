"""Migrations and their registry: what turns a checkpoint of one graph version into one
of another, and the shortest chain between two versions."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar, overload

from langgraph_durable.errors import (
    ConfigurationError,
)
from langgraph_durable.versioning.keys import (
    _END,
    _START,
)

# --- migrations ----------------------------------------------------------------------

MigrationFn = Callable[[dict[str, Any]], dict[str, Any]]
F = TypeVar("F", bound=MigrationFn)


def is_routing_channel(name: str) -> bool:
    """LangGraph's own channels (triggers, Sends, input): never handed to a migration fn."""
    return name.startswith(("branch:", "join:", "start:", "__"))


@dataclass(frozen=True)
class Migration:
    """One step ``from_version -> to_version``.

    ``fn`` rewrites the state: it receives a deep copy of the state channels (your
    state keys, after ``rename_channels``; LangGraph's routing channels are left out)
    and returns the new ones.
    ``rename_nodes`` maps old node names to new ones for pending work (triggers,
    Sends, finished-task writes, interrupts); ``drop_nodes`` discards the pending work
    of removed nodes on purpose; ``rename_channels`` renames state keys (values,
    versions and pending writes)."""

    from_version: str
    to_version: str
    fn: MigrationFn | None = None
    rename_nodes: Mapping[str, str] = field(default_factory=dict)
    drop_nodes: frozenset[str] = frozenset()
    rename_channels: Mapping[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.from_version}->{self.to_version}"


def _check_name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigurationError(f"{what} must be a non-empty string, got {value!r}", value=value)
    return value


class MigrationRegistry:
    """Registered migrations; finds the shortest chain between two versions.

    ``registry.register("v1", "v2", fn, rename_nodes={"review": "approve"})``, or as a
    decorator ``@registry.register("v1", "v2")``. ``registry.register("v1", "v2")``
    alone declares v2 able to run v1 checkpoints as they are (an identity migration).
    """

    def __init__(self) -> None:
        self._edges: dict[str, list[Migration]] = {}

    @overload
    def register(
        self,
        from_version: str,
        to_version: str,
        fn: F,
        *,
        rename_nodes: Mapping[str, str] | None = ...,
        drop_nodes: Iterable[str] | None = ...,
        rename_channels: Mapping[str, str] | None = ...,
    ) -> F: ...

    @overload
    def register(
        self,
        from_version: str,
        to_version: str,
        fn: None = ...,
        *,
        rename_nodes: Mapping[str, str] | None = ...,
        drop_nodes: Iterable[str] | None = ...,
        rename_channels: Mapping[str, str] | None = ...,
    ) -> Callable[[F], F]: ...

    def register(
        self,
        from_version: str,
        to_version: str,
        fn: MigrationFn | None = None,
        *,
        rename_nodes: Mapping[str, str] | None = None,
        drop_nodes: Iterable[str] | None = None,
        rename_channels: Mapping[str, str] | None = None,
    ) -> Any:
        """Register a migration. Without ``fn`` it is registered at once as an identity
        (plus renames) and the return value is a decorator that sets ``fn``."""
        _check_name(from_version, "from_version")
        _check_name(to_version, "to_version")
        if from_version == to_version:
            raise ConfigurationError("a migration must change the version", version=from_version)
        if fn is not None and not callable(fn):
            raise ConfigurationError(f"migration fn must be callable, got {type(fn).__name__}")
        renames = dict(rename_nodes or {})
        drops = frozenset(drop_nodes or ())
        channel_renames = dict(rename_channels or {})
        for old, new in renames.items():
            _check_name(old, "rename_nodes key")
            _check_name(new, "rename_nodes value")
            if old == new or old in (_START, _END) or new in (_START, _END):
                raise ConfigurationError(f"cannot rename node {old!r} to {new!r}", node=old)
        for name in drops:
            _check_name(name, "drop_nodes entry")
            if name in (_START, _END):
                raise ConfigurationError(f"cannot drop node {name!r}", node=name)
        if clash := sorted(drops & (set(renames) | set(renames.values()))):
            raise ConfigurationError(
                f"node(s) {clash} are both renamed and dropped in {from_version}->{to_version}",
                nodes=clash,
            )
        for old, new in channel_renames.items():
            _check_name(old, "rename_channels key")
            _check_name(new, "rename_channels value")
            if is_routing_channel(old) or is_routing_channel(new):
                raise ConfigurationError(
                    f"rename_channels renames state keys only, not {old!r} -> {new!r} "
                    "(use rename_nodes for routing)",
                    channel=old,
                )
        migration = Migration(from_version, to_version, fn, renames, drops, channel_renames)
        self._add(migration)
        if fn is not None:
            return fn

        def decorator(f: F) -> F:
            if not callable(f):
                raise ConfigurationError(f"migration fn must be callable, got {type(f).__name__}")
            self._add(replace(migration, fn=f))
            return f

        return decorator

    def _add(self, m: Migration) -> None:
        edges = self._edges.setdefault(m.from_version, [])
        edges[:] = [e for e in edges if e.to_version != m.to_version] + [m]

    def path(self, from_version: str, to_version: str) -> list[Migration] | None:
        """The shortest chain of migrations, ``[]`` for equal versions, else ``None``."""
        if from_version == to_version:
            return []
        seen = {from_version}
        queue: deque[tuple[str, list[Migration]]] = deque([(from_version, [])])
        while queue:
            version, chain = queue.popleft()
            for m in self._edges.get(version, []):
                if m.to_version in seen:
                    continue
                nxt = [*chain, m]
                if m.to_version == to_version:
                    return nxt
                seen.add(m.to_version)
                queue.append((m.to_version, nxt))
        return None

    def versions(self) -> set[str]:
        """Every version a registered migration starts from or leads to."""
        return set(self._edges) | {m.to_version for ms in self._edges.values() for m in ms}

    def sources(self, to_version: str) -> set[str]:
        """Stored versions a graph at ``to_version`` can run after migrating (itself included)."""
        return {to_version} | {v for v in self.versions() if self.path(v, to_version) is not None}

    def __iter__(self) -> Iterator[Migration]:
        for edges in self._edges.values():
            yield from edges

    def __bool__(self) -> bool:
        return bool(self._edges)

    def __len__(self) -> int:
        return sum(len(v) for v in self._edges.values())

    def __repr__(self) -> str:
        return f"MigrationRegistry({[m.label for m in self]})"
