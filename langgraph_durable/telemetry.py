"""OpenTelemetry spans and Prometheus metrics, both optional.

    pip install "langgraph-durable[otel]"        # spans (opentelemetry-api)
    pip install "langgraph-durable[prometheus]"  # metrics (prometheus-client)

The interface is small on purpose, so call sites elsewhere are one line each:

* ``span(name, **attrs)``: a context manager, an OpenTelemetry span
  ``langgraph_durable.<name>`` (a shared no-op when opentelemetry is not installed);
* ``count(name, value=1, **labels)`` and ``observe(name, value, **labels)``: a
  Prometheus counter / histogram from :data:`METRICS` (no-ops without prometheus-client);
* ``instrument(kind)``: a decorator for the saver's, ledger's and worker's functions.
  When neither library is installed (or ``LANGGRAPH_DURABLE_TELEMETRY=off``) it returns
  the function itself: the disabled hot path costs nothing at all.

Neither library is imported until the first span or metric: ``import langgraph_durable``
stays as fast as before. Spans go to whatever ``TracerProvider`` the application sets
(none: OpenTelemetry's own no-op); metrics go to prometheus-client's default registry,
which ``langgraph-durable worker --metrics-port P`` serves on ``/metrics`` (see
:func:`serve`), next to ``/healthz``.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import importlib.util
import inspect
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from langgraph_durable._view import SaverView

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

PREFIX = "langgraph_durable"


def _available(module: str) -> bool:
    # find_spec does not import the module itself (only its parent package): cheap.
    try:
        return importlib.util.find_spec(module) is not None
    except Exception:  # a blocked or broken install counts as absent
        return False


_OFF = os.environ.get("LANGGRAPH_DURABLE_TELEMETRY", "").strip().lower() in ("0", "off", "false", "no")
HAS_OTEL = not _OFF and _available("opentelemetry.trace")
HAS_PROMETHEUS = not _OFF and _available("prometheus_client")
ENABLED = HAS_OTEL or HAS_PROMETHEUS

_SECONDS = (0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_BYTES = tuple(float(4**i) for i in range(4, 13))  # 256 B .. 16 MiB

# name (without the prefix) -> (type, help, label names, buckets). Names follow
# Prometheus' conventions: base units in the name, counters end in _total.
METRICS: dict[str, tuple[str, str, tuple[str, ...], tuple[float, ...] | None]] = {
    "put_seconds": ("histogram", "Latency of a checkpoint put (one round trip, fence included).", (), _SECONDS),
    "put_writes_seconds": ("histogram", "Latency of a put_writes (pending writes of a task).", (), _SECONDS),
    "get_seconds": ("histogram", "Latency of a get_tuple (a run start included).", (), _SECONDS),
    "checkpoint_bytes": ("histogram", "Encoded bytes of a checkpoint (its JSON and new blobs).", (), _BYTES),
    "artifacts_deduplicated_total": ("counter", "Artifacts not sent again: already stored for the thread.", (), None),
    "run_starts_total": ("counter", "Run starts (lease taken, checkpoint loaded).", ("result",), None),
    "lease_acquisitions_total": ("counter", "Lease acquisitions by result (ok, busy, quarantined).", ("result",), None),
    "lease_renewals_total": ("counter", "Leases renewed (ok) or found lost (lost) by the renewer.", ("result",), None),
    "leases_taken_over_total": ("counter", "Leases taken from another owner (expired, dead_owner).", ("reason",), None),
    "fenced_writes_total": ("counter", "Writes refused by the lease fence (lease_lost, busy).", ("reason",), None),
    "quarantines_total": ("counter", "Threads quarantined, by reason.", ("reason",), None),
    "ledger_outcomes_total": ("counter", "@idempotent call outcomes (run, hit, takeover, conflict, failed, unknown).", ("outcome",), None),
    "migrations_total": ("counter", "State migrations by result (applied, dry_run, failed).", ("result",), None),
    "worker_claims_total": ("counter", "Threads claimed by recovery workers, by their previous status.", ("previous_status",), None),
    "worker_recoveries_total": ("counter", "Recoveries by outcome (finished, handed_back, lease_lost, refused, failed).", ("outcome",), None),
}
# --- failover branch ---
METRICS["acknowledged_work_lost_total"] = (
    "counter",
    "Runs that found a checkpoint they had stored missing on the server (asynchronous "
    "failover), by where it was noticed (put, await, release). Each is re-run from the real head.",
    ("where",),
    None,
)

METRICS["ledger_records_restored_total"] = (
    "counter",
    "@idempotent records this process had stored and the server lost (asynchronous failover), "
    "written again from memory (_acked), by where (claim, release).",
    ("where",),
    None,
)

_NULL = contextlib.nullcontext()
_lock = threading.Lock()
_tracer: Any = None
_metrics: dict[str, Any] = {}


_provider_set = False
_trace: Any = None  # the opentelemetry.trace module, once imported
_UNKNOWN = object()


def _get_tracer() -> Any:
    """The package's tracer, or None while no TracerProvider is configured (the API's
    default proxy would make no-op spans, at a few microseconds each on the hot path).
    A provider, once set, stays set: after that the check is one global read."""
    global _tracer, HAS_OTEL, _provider_set, _trace
    if not _provider_set:
        if _trace is None:
            try:
                from opentelemetry import trace
            except Exception:  # absent after all: stay silent, never break a run
                HAS_OTEL = False
                return None
            _trace = trace
            # Once the public way: a provider named by OTEL_PYTHON_TRACER_PROVIDER
            # is loaded (and set globally) by this first call.
            trace.get_tracer_provider()
        elif getattr(_trace, "_TRACER_PROVIDER", _UNKNOWN) is None:
            # No provider set yet (opentelemetry's own global, read without
            # get_tracer_provider(): its environment lookup cost ~0.6 us per put,
            # put_writes and get, issue 14). Set later, it is seen on the next call.
            return None
        if isinstance(_trace.get_tracer_provider(), _trace.ProxyTracerProvider):
            return None
        from langgraph_durable._version import __version__

        # The tracer first: a wrapper that sees _provider_set reads _tracer without a lock.
        _tracer = _trace.get_tracer(PREFIX, __version__)
        _provider_set = True
    return _tracer


def _attrs(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """OpenTelemetry attribute values: str, bool, int, float (None left out)."""
    out: dict[str, Any] = {}
    for k, v in attrs.items():
        if v is None:
            continue
        out[f"{PREFIX}.{k}"] = v if isinstance(v, str | bool | int | float) else str(v)
    return out


def span(name: str, /, **attrs: Any) -> Any:
    """A context manager: the current span ``langgraph_durable.<name>`` with ``attrs``
    (prefixed ``langgraph_durable.``); a shared no-op without opentelemetry."""
    if not HAS_OTEL:
        return _NULL
    tracer = _get_tracer()
    if tracer is None:
        return _NULL
    return tracer.start_as_current_span(f"{PREFIX}.{name}", attributes=_attrs(attrs))


def _start(name: str, attrs: Mapping[str, Any]) -> Any:
    """A span that is NOT made current: for generator ops, which may be resumed in
    another context (an async driver, another thread) than the one that started them."""
    if not HAS_OTEL:
        return None
    tracer = _get_tracer()
    return None if tracer is None else tracer.start_span(f"{PREFIX}.{name}", attributes=_attrs(attrs))


def _end(sp: Any, exc: BaseException | None = None, **attrs: Any) -> None:
    if sp is None:
        return
    try:
        if attrs:
            sp.set_attributes(_attrs(attrs))
        if exc is not None and not isinstance(exc, GeneratorExit):
            sp.record_exception(exc)
            from opentelemetry.trace import Status, StatusCode

            sp.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}"))
    finally:
        sp.end()


def annotate(**attrs: Any) -> None:
    """Set attributes on the current span (if any)."""
    if not HAS_OTEL or _get_tracer() is None:
        return
    from opentelemetry import trace

    trace.get_current_span().set_attributes(_attrs(attrs))


def _metric(name: str) -> Any:
    global HAS_PROMETHEUS
    metric = _metrics.get(name)
    if metric is not None:
        return metric
    with _lock:
        metric = _metrics.get(name)
        if metric is not None:
            return metric
        try:
            import prometheus_client as pc
        except Exception:
            HAS_PROMETHEUS = False
            return None
        key = name if name in METRICS else f"{name}_total"
        kind, doc, labels, buckets = METRICS[key]
        full = f"{PREFIX}_{key}"
        if kind == "histogram" and not labels and not _multiprocess():
            metric = _Histogram(full, doc, buckets or pc.Histogram.DEFAULT_BUCKETS)
        elif kind == "histogram":
            metric = pc.Histogram(full, doc, labels, buckets=buckets or pc.Histogram.DEFAULT_BUCKETS)
        else:
            # prometheus-client appends _total to a counter's name itself.
            metric = pc.Counter(full.removesuffix("_total"), doc, labels)
        _metrics[name] = metric
        return metric


def _multiprocess() -> bool:
    """prometheus-client's multiprocess mode (its values live in shared files)."""
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR") or os.environ.get("prometheus_multiproc_dir"))


class _Histogram:
    """A Prometheus histogram without labels, registered as a custom collector that
    reports exactly what prometheus-client's ``Histogram`` reports (cumulative
    ``_bucket`` samples, ``_count``, ``_sum``, ``_created``). Observing takes one
    bisect and one lock; ``Histogram.observe`` costs five Python calls, two locks and
    a loop over the buckets (~0.6 us; issue 14: 30+ observations per invoke, on
    LangGraph's critical path). Multiprocess mode keeps prometheus-client's own."""

    def __init__(self, name: str, doc: str, buckets: Any, registry: Any = None) -> None:
        from prometheus_client import REGISTRY

        bounds = [float(b) for b in buckets]
        if not bounds or bounds[-1] != math.inf:
            bounds.append(math.inf)
        self._name, self._doc = name, doc
        self._bounds = tuple(bounds)
        self._counts = [0] * len(bounds)
        self._sum = 0.0
        self._lock = threading.Lock()
        self._created = time.time()
        (registry if registry is not None else REGISTRY).register(self)

    def observe(self, amount: float) -> None:
        # bisect_left: the first bound >= amount, Histogram's ``amount <= bound``.
        i = bisect.bisect_left(self._bounds, amount)
        with self._lock:
            self._sum += amount
            if amount == amount:  # NaN: counted in no bucket, as prometheus-client does
                self._counts[i] += 1

    def describe(self) -> list[Any]:
        from prometheus_client.metrics_core import Metric

        return [Metric(self._name, self._doc, "histogram")]

    def collect(self) -> list[Any]:
        import prometheus_client.metrics as pm
        from prometheus_client.metrics_core import Metric
        from prometheus_client.utils import floatToGoString

        with self._lock:
            counts, total = list(self._counts), self._sum
        metric = Metric(self._name, self._doc, "histogram")
        acc = 0.0
        for bound, n in zip(self._bounds, counts, strict=True):
            acc += n
            metric.add_sample(f"{self._name}_bucket", {"le": floatToGoString(bound)}, acc)
        metric.add_sample(f"{self._name}_count", {}, acc)
        if self._bounds[0] >= 0:
            metric.add_sample(f"{self._name}_sum", {}, total)
        if getattr(pm, "_use_created", True):
            metric.add_sample(f"{self._name}_created", {}, self._created)
        return [metric]


def count(name: str, value: float = 1, /, **labels: Any) -> None:
    """Add ``value`` to the counter ``langgraph_durable_<name>`` (see :data:`METRICS`)."""
    if not HAS_PROMETHEUS or not value:
        return
    metric = _metric(name)
    if metric is not None:
        (metric.labels(**{k: str(v) for k, v in labels.items()}) if labels else metric).inc(value)


def observe(name: str, value: float, /, **labels: Any) -> None:
    """Record ``value`` in the histogram ``langgraph_durable_<name>``."""
    if not HAS_PROMETHEUS:
        return
    metric = _metric(name)
    if metric is not None:
        (metric.labels(**{k: str(v) for k, v in labels.items()}) if labels else metric).observe(value)


def checkpoint_bytes(cp_json: Any, blob_rows: list[Any]) -> None:
    """Bytes per checkpoint, from what a put sends: its JSON and its new blobs."""
    if not HAS_PROMETHEUS:
        return
    size = len(getattr(cp_json, "obj", "") or "")
    for row in blob_rows:
        size += len(row[5] or b"")
    hist = _metrics.get("checkpoint_bytes")
    if hist is None:  # first observation: create the metric (under the lock)
        observe("checkpoint_bytes", size)
        return
    hist.observe(size)


# --------------------------------------------------------------------------- decorators


def _timed(fn: Any, name: str, metric: str | None, attrs_of: Callable[..., dict[str, Any]]) -> Any:
    """A span around a sync or async function, its duration into ``metric``. Without a
    TracerProvider the attributes are not even computed: a put pays a clock read and a
    histogram observation, inline (issue 14: put, put_writes and get run 20+ times per
    invoke, on LangGraph's critical path: no context manager or handler frame on the
    common path)."""
    full = f"{PREFIX}.{name}"
    key = metric or ""

    def span_of(tracer: Any, args: Any, kwargs: Any) -> Any:
        return tracer.start_as_current_span(full, attributes=_attrs(_safely(attrs_of, *args, **kwargs) or {}))

    def done(seconds: float) -> None:
        hist = _metrics.get(key)
        if hist is None:  # first observation: create the metric (under the lock)
            _safely(observe, metric, seconds)
            return
        try:
            hist.observe(seconds)
        except Exception:
            logger.debug("telemetry: could not observe %s", metric, exc_info=True)

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def awrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            tracer = (_tracer if _provider_set else _get_tracer()) if HAS_OTEL else None
            try:
                if tracer is None:
                    return await fn(*args, **kwargs)
                with span_of(tracer, args, kwargs):
                    return await fn(*args, **kwargs)
            finally:
                if metric is not None and HAS_PROMETHEUS:
                    done(time.perf_counter() - t0)

        return awrapper

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        tracer = (_tracer if _provider_set else _get_tracer()) if HAS_OTEL else None
        try:
            if tracer is None:
                return fn(*args, **kwargs)
            with span_of(tracer, args, kwargs):
                return fn(*args, **kwargs)
        finally:
            if metric is not None and HAS_PROMETHEUS:
                done(time.perf_counter() - t0)

    return wrapper


def _generator(
    fn: Any,
    name: str,
    attrs_of: Callable[..., dict[str, Any]],
    after: Callable[..., dict[str, Any]] | None = None,
    failed: Callable[[BaseException], None] | None = None,
) -> Any:
    """A span around an Op/Flow generator (not made current, see :func:`_start`);
    ``after(result, *args)`` returns attributes to add and may count."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        sp = _start(name, _safely(attrs_of, *args, **kwargs) or {})
        try:
            result = yield from fn(*args, **kwargs)
        except BaseException as exc:
            if failed is not None:
                _safely(failed, exc)
            _safely(_end, sp, exc)
            raise
        extra = (_safely(after, result, *args, **kwargs) if after is not None else None) or {}
        _safely(_end, sp, None, **extra)
        return result

    return wrapper


def _safely(handler: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run a telemetry handler; its failure is logged, never the caller's problem."""
    try:
        return handler(*args, **kwargs)
    except Exception:
        logger.debug("telemetry handler %s failed", getattr(handler, "__name__", handler), exc_info=True)
        return None


def _after_call(fn: Any, after: Callable[..., None]) -> Any:
    """Call ``after(result, exc, *args)`` once ``fn`` returned or raised (sync)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            _safely(after, None, exc, *args, **kwargs)
            raise
        _safely(after, result, None, *args, **kwargs)
        return result

    return wrapper


def _configurable(config: Any) -> Mapping[str, Any]:
    return (config or {}).get("configurable") or {}


def _put_attrs(self: Any, config: Any, checkpoint: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    c = _configurable(config)
    return {
        "thread_id": c.get("thread_id"), "checkpoint_ns": c.get("checkpoint_ns") or None,
        "checkpoint_id": checkpoint.get("id"), "parent_checkpoint_id": c.get("checkpoint_id"),
    }


def _put_writes_attrs(self: Any, config: Any, writes: Any, task_id: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    c = _configurable(config)
    return {"thread_id": c.get("thread_id"), "checkpoint_id": c.get("checkpoint_id"), "task_id": task_id,
            "writes": len(writes)}


def _get_attrs(self: Any, config: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    c = _configurable(config)
    return {"thread_id": c.get("thread_id"), "checkpoint_id": c.get("checkpoint_id")}


def _run_start_attrs(self: Any, config: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    return _get_attrs(self, config)


def _run_start_after(result: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    saved, lease = result
    count("run_starts", result="ok")
    return {"lease_token": lease.token, "attempts": lease.attempts,
            "checkpoint_id": lease.checkpoint_id, "graph_version": lease.version,
            "resumed": saved is not None}


def _run_start_failed(exc: BaseException) -> None:
    if not isinstance(exc, GeneratorExit):
        count("run_starts", result=type(exc).__name__)


def _acquire_attrs(
    self: Any, thread_id: str, owner: str, version: Any, checkpoint_id: Any, *args: Any, **kwargs: Any
) -> dict[str, Any]:
    return {"thread_id": thread_id, "owner": owner, "graph_version": version, "checkpoint_id": checkpoint_id}


def _acquire_after(result: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    if result.get("contended"):  # the contended path (who holds it, takeover) follows
        return {"result": "contended"}
    if result.get("ok"):
        outcome = "ok"
    else:
        outcome = "quarantined" if result.get("status") == "quarantined" else "busy"
    count("lease_acquisitions", result=outcome)
    return {"result": outcome, "lease_token": result.get("lease_token"), "holder": result.get("lease_owner")}


def _renew(fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapper(self: Any, leases: list[Any]) -> Any:
        with span("lease.renew", leases=len(leases)):
            fn(self, leases)
        lost = sum(1 for lease in leases if lease.lost)
        _safely(count, "lease_renewals", len(leases) - lost, result="ok")
        _safely(count, "lease_renewals", lost, result="lost")

    return wrapper


def _fence_error_after(result: Any, exc: BaseException | None, *args: Any, **kwargs: Any) -> None:
    if result is not None:
        _count_fence(result)


def _check_fence_after(result: Any, exc: BaseException | None, *args: Any, **kwargs: Any) -> None:
    if exc is not None:
        _count_fence(exc)


def _count_fence(err: BaseException) -> None:
    from langgraph_durable.errors import LeaseLostError, ThreadBusyError

    if isinstance(err, LeaseLostError):
        count("fenced_writes", reason="lease_lost")
    elif isinstance(err, ThreadBusyError):
        count("fenced_writes", reason="busy")


def _quarantine_attrs(self: Any, lease: Any, record: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    count("quarantines", reason=record.reason)
    return {"thread_id": record.thread_id, "checkpoint_id": record.checkpoint_id,
            "attempts": record.attempts, "reason": record.reason}


def _migration_attrs(saver: SaverView, saved: Any, stored: str, current: str, chain: Any, **kwargs: Any) -> dict[str, Any]:
    c = _configurable(saved.config)
    return {"thread_id": c.get("thread_id"), "checkpoint_id": c.get("checkpoint_id"),
            "from_version": stored, "to_version": current, "steps": len(chain),
            "origin": kwargs.get("origin", "run"), "dry_run": bool(kwargs.get("dry_run"))}


def _migration_after(result: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    count("migrations", result="dry_run" if kwargs.get("dry_run") else "applied")
    return {}


def _migration_failed(exc: BaseException) -> None:
    if not isinstance(exc, GeneratorExit):
        count("migrations", result="failed")


def _call_attrs(call: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    return {"key": call.key, "name": call.spec.name, "thread_id": call.thread_id,
            "transactional": bool(call.spec.transactional)}


_JUDGED = {"replay": "hit", "takeover": "takeover"}
_JUDGE_ERRORS = {
    "IdempotencyConflictError": "conflict",
    "IdempotentCallFailedError": "failed",
    "OutcomeUnknownError": "unknown",
}


def _ledger_outcome(outcome: str) -> None:
    count("ledger_outcomes", outcome=outcome)
    annotate(outcome=outcome)


def _judge_after(result: Any, exc: BaseException | None, *args: Any, **kwargs: Any) -> None:
    outcome = _JUDGE_ERRORS.get(type(exc).__name__) if exc is not None else _JUDGED.get(result)
    if outcome is not None:  # "wait" is a poll, not an outcome
        _ledger_outcome(outcome)


def _enter_after(result: Any, exc: BaseException | None, *args: Any, **kwargs: Any) -> None:
    if exc is None:
        _ledger_outcome("run")


def _claim_after(result: Any, exc: BaseException | None, self: Any, claim: Any) -> None:
    count("worker_claims", previous_status=claim.previous_status)
    if claim.previous_status == "running":  # its holder's lease expired: a crash
        count("leases_taken_over", reason="expired")


def _recovery_after(result: Any, exc: BaseException | None, *args: Any, **kwargs: Any) -> None:
    if result is not None:
        count("worker_recoveries", outcome=result.outcome)


_KINDS: dict[str, Callable[[Any], Any]] = {
    "put": lambda fn: _timed(fn, "put", "put_seconds", _put_attrs),
    "put_writes": lambda fn: _timed(fn, "put_writes", "put_writes_seconds", _put_writes_attrs),
    "get": lambda fn: _timed(fn, "get", "get_seconds", _get_attrs),
    "run_start": lambda fn: _generator(fn, "run_start", _run_start_attrs, _run_start_after, _run_start_failed),
    "lease_acquire": lambda fn: _generator(fn, "lease.acquire", _acquire_attrs, _acquire_after),
    "lease_renew": _renew,
    "fence_error": lambda fn: _after_call(fn, _fence_error_after),
    "check_fence": lambda fn: _after_call(fn, _check_fence_after),
    "quarantine": lambda fn: _generator(fn, "quarantine", _quarantine_attrs),
    "migration": lambda fn: _generator(fn, "migration", _migration_attrs, _migration_after, _migration_failed),
    "idempotent": lambda fn: _timed(fn, "idempotent", None, _call_attrs),
    "ledger_judge": lambda fn: _after_call(fn, _judge_after),
    "ledger_run": lambda fn: _after_call(fn, _enter_after),
    "worker_claim": lambda fn: _after_call(fn, _claim_after),
    "worker_result": lambda fn: _after_call(fn, _recovery_after),
}


def instrument(kind: str) -> Callable[[F], F]:
    """The decorator for one instrumented function (see ``_KINDS``); the identity when
    telemetry is disabled, so the disabled path is the undecorated function."""
    make = _KINDS[kind]
    if not ENABLED:
        return lambda fn: fn
    return lambda fn: make(fn)


# --------------------------------------------------------------------------- worker endpoints


def serve(port: int, health: Callable[[], tuple[bool, str]], host: str = "0.0.0.0") -> Any:
    """Serve ``/metrics`` (prometheus-client's default registry) and ``/healthz``
    (``health()``: 200 with its message when true, 503 otherwise) on a daemon thread.
    Returns the server (``.server_address``, ``.shutdown()``)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                if not HAS_PROMETHEUS:
                    self._reply(501, b"prometheus-client is not installed "
                                     b"(pip install 'langgraph-durable[prometheus]')\n", "text/plain")
                    return
                from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

                self._reply(200, generate_latest(REGISTRY), CONTENT_TYPE_LATEST)
            elif path in ("/healthz", "/livez", "/readyz"):
                try:
                    ok, message = health()
                except Exception as exc:
                    ok, message = False, f"health check failed: {type(exc).__name__}: {exc}"
                self._reply(200 if ok else 503, (message + "\n").encode(), "text/plain")
            else:
                self._reply(404, b"not found\n", "text/plain")

        def _reply(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            logger.debug("metrics endpoint: " + format, *args)

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="langgraph-durable-metrics", daemon=True).start()
    return server
