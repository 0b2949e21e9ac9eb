"""The operator console: a Starlette app over the package's operator APIs.

Every view reads through the same functions the CLI uses (``inspect``, ``poison``,
``idempotency.Ledger``, ``versioning``, ``retention``, ``audit``); every action calls
the operator API that records it in ``durable_audit`` (the console only says who is
acting, with ``audit.acting_as``). Pages are rendered on the server (Jinja2); charts
are inline SVG; there is no JavaScript.

Safety (docs/console.md): actions exist only with ``allow_actions``; they need a
signed-in session (the token printed at start, or ``LGD_CONSOLE_TOKEN``), a CSRF token
in the form, and go through a confirmation page that shows what will change.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from langgraph_durable.saver import DurablePostgresSaver
from urllib.parse import quote, urlencode, urlsplit

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from langgraph_durable import audit, poison
from langgraph_durable.console import _decide, _svg
from langgraph_durable.console import _messages as msg
from langgraph_durable.console._security import COOKIE, Session, Sessions, csrf_ok
from langgraph_durable.errors import DurableError
from langgraph_durable.idempotency import Ledger
from langgraph_durable.keyring import decryption_error
from langgraph_durable.leases.dead import dead_owner_note
from langgraph_durable.ops import control, retention
from langgraph_durable.ops import inspection as lgi
from langgraph_durable.ops import migrations as versioning
from langgraph_durable.sql import console as q
from langgraph_durable.states import STATUSES as _STATUSES

logger = logging.getLogger("langgraph_durable.console")

PAGE = 50
# Seconds a page's reader (and the standby lag it shows) is reused before measuring again.
READ_REFRESH = 2.0
STATES = ("running", "recoverable", "waiting", "quarantined", "error", "queued", "done", "untracked")
ACTIONS = ("release", "rewind", "resolve", "forget", *_decide.DECISIONS)


def _fmt_bytes(n: Any) -> str:
    from langgraph_durable.cli._common import fmt_bytes

    return fmt_bytes(n)


def _ago(value: Any) -> str:
    if value is None or value == "":
        return "-"
    when = _as_datetime(value)
    if when is None and isinstance(value, str):
        return value
    if when is not None:
        s = (dt.datetime.now(dt.UTC) - when).total_seconds()
        if s < 0:
            return "just now"
        for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
            if s >= size:
                return f"{s / size:.0f} {unit} ago"
        return f"{s:.0f} s ago"
    return str(value)


def _short(text: Any, width: int = 80) -> str:
    s = "" if text is None else str(text)
    s = " ".join(s.split())
    return s if len(s) <= width else s[: width - 1] + "…"


def _env() -> Environment:
    env = Environment(
        loader=PackageLoader("langgraph_durable.console", "templates"),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["bytes"] = _fmt_bytes
    env.filters["ago"] = _ago
    env.filters["short"] = _short
    env.filters["cp"] = lambda v: (str(v)[:18] if v else "-")
    env.filters["q"] = lambda v: quote(str(v), safe="")
    env.filters["tojson_pretty"] = lambda v: json.dumps(v, indent=2, default=str, sort_keys=True)
    env.filters["pretty"] = _pretty
    env.filters["abs"] = _abs_time
    env.filters["dur"] = _duration
    env.filters["in_unit"] = _in_unit
    return env


PRETTY_MAX = 16 * 1024


def _pretty(value: Any) -> str:
    """A value as indented JSON (any other type by its repr), bounded, the cut said."""
    try:
        text = json.dumps(value, indent=2, default=repr, sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError):  # keys of mixed types cannot be sorted
        text = json.dumps(value, indent=2, default=repr, ensure_ascii=False)
    if len(text) > PRETTY_MAX:
        text = text[:PRETTY_MAX] + f"\n… {len(text) - PRETTY_MAX} more characters not shown"
    return text


def _as_datetime(value: Any) -> dt.datetime | None:
    if isinstance(value, str) and value:
        try:
            value = dt.datetime.fromisoformat(value)
        except ValueError:
            return None
    if not isinstance(value, dt.datetime):
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)


def _abs_time(value: Any) -> str:
    """An absolute UTC timestamp (beside the relative one)."""
    when = _as_datetime(value)
    return "" if when is None else when.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _duration(seconds: Any) -> str:
    if not isinstance(seconds, int | float) or seconds < 0:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


class Sampler:
    """Samples the checkpoint insert counter and the tables' size every ``interval``
    seconds (and when the overview is opened), for the overview's charts. Kept in
    memory: the charts cover the time since the console started."""

    def __init__(self, saver: DurablePostgresSaver, interval: float, keep: int = 720) -> None:
        self.saver = saver
        self.interval = interval
        self.samples: deque[dict[str, Any]] = deque(maxlen=keep)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def sample(self, min_age: float = 0.0) -> None:
        with self._lock:
            if self.samples and time.time() - self.samples[-1]["t"] < min_age:
                return
            try:
                with self.saver.connection() as conn, conn.cursor(row_factory=_dict_row()) as cur:
                    cur.execute(q.SAMPLE_SQL)
                    row = cur.fetchone()
                    assert row is not None  # one aggregate row, always
                    ins, wins, total = row["checkpoints_inserted"], row["writes_inserted"], row["total_bytes"]
            except Exception:  # a sample is best effort; the page reports errors itself
                logger.debug("console sample failed", exc_info=True)
                return
            self.samples.append(
                {"t": time.time(), "checkpoints": int(ins), "writes": int(wins), "bytes": int(total)}
            )

    def start(self) -> None:
        if self.interval <= 0 or self._thread is not None:
            return

        def run() -> None:
            while not self._stop.wait(self.interval):
                self.sample()

        self._thread = threading.Thread(target=run, name="lgd-console-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)

    def rate_points(self) -> list[tuple[float, float]]:
        s = list(self.samples)
        out = []
        for a, b in zip(s, s[1:], strict=False):
            dtime = b["t"] - a["t"]
            if dtime > 0:
                out.append((b["t"], max(0, b["checkpoints"] - a["checkpoints"]) / dtime))
        return out

    def bytes_points(self) -> list[tuple[float, float]]:
        return [(s["t"], float(s["bytes"])) for s in self.samples]


class Console:
    """State of one console: the saver, the safety settings, the sessions."""

    def __init__(
        self,
        saver: DurablePostgresSaver,
        *,
        allow_actions: bool,
        token: str | None,
        sample_interval: float = 10.0,
        graph: Any = None,
        registry: Any = None,
        archive_url: str | None = None,
    ) -> None:
        if allow_actions and not token:
            raise ValueError("allow_actions needs a token")
        # Given a reader (the read-only CLI's), the saver it was made from: actions, the
        # sampler's counters and dry-runs read the primary, pages ask it for readers.
        self.saver = getattr(saver, "_origin", saver)
        self.allow_actions = allow_actions
        self.sessions = Sessions(token or "")
        self.env = _env()
        self.sampler = Sampler(self.saver, sample_interval)
        self.graph = graph
        self.registry = registry
        self.archive_url = archive_url
        self._runnable: Any = None
        self._natural: bool | None = None
        # Reads off the primary (core/reader.py): pages read with saver.reader(), measured
        # again at most every READ_REFRESH seconds; actions and the sampler use the saver.
        self._reader: Any = None
        self._reader_at = 0.0
        self._reader_lock = threading.Lock()
        # An action committed: pages read the primary until the standby has replayed
        # it (saver.reader_after_write), so the page after an action shows the action.
        self._wrote = False

    def runnable_graph(self) -> Any:
        """The graph compiled on this console's saver (for an answer run here), or None."""
        if self.graph is None:
            return None
        if self._runnable is None:
            g = self.graph
            if hasattr(g, "compile"):  # a builder: compiled on this console's saver
                g = g.compile(checkpointer=self.saver)
            elif not hasattr(g, "invoke") and callable(g):  # factory(saver), as the worker takes
                g = g(self.saver)
            self._runnable = g
        return self._runnable

    def read(self) -> Any:
        """The reader of this page: the standby (with ``read_dsn``) or the primary."""
        with self._reader_lock:
            now = time.monotonic()
            if self._reader is None or now - self._reader_at >= READ_REFRESH:
                if self._wrote:  # the primary (always current) until the standby has it
                    reader = self.saver.reader_after_write()
                    self._wrote = reader.read_lag.after_write
                else:
                    reader = self.saver.reader()
                self._reader, self._reader_at = reader, now
            return self._reader

    def wrote(self) -> None:
        """An action ran: the next page measures again, and reads the primary until
        the standby has replayed it."""
        with self._reader_lock:
            self._wrote, self._reader_at = True, 0.0

    # ---------------------------------------------------------------- rendering
    def session(self, request: Request) -> Session | None:
        if not self.allow_actions:
            return None
        return self.sessions.get(request.cookies.get(COOKIE))

    def render(self, request: Request, name: str, status: int = 200, **ctx: Any) -> HTMLResponse:
        session = self.session(request)
        flash = []
        if session is not None and session.flash:
            flash, session.flash = session.flash, []
        html = self.env.get_template(name).render(
            request=request,
            allow_actions=self.allow_actions,
            session=session,
            csrf=session.csrf if session else "",
            flash=flash,
            path=request.url.path,
            query=str(request.url.query),
            # A page that read the primary (the confirmation) passes reading=None: no
            # standby line above what was read on the primary.
            reading=ctx.pop("reading") if "reading" in ctx else getattr(self._reader, "read_lag", None),
            **ctx,
        )
        return HTMLResponse(html, status_code=status)

    def error(self, request: Request, status: int, title: str, message: str) -> HTMLResponse:
        return self.render(request, "error.html", status=status, title=title, message=message)

    def guard(self, request: Request, fn: Callable[[], HTMLResponse]) -> HTMLResponse:
        try:
            return fn()
        except DurableError as exc:
            status = 404 if isinstance(exc, LookupError) else 400
            return self.error(request, status, type(exc).__name__, exc.message)
        except ValueError as exc:  # a malformed query parameter (limit=abc)
            return self.error(request, 400, "bad request", str(exc))

    # ---------------------------------------------------------------- views
    def overview(self, request: Request) -> HTMLResponse:
        # Untracked threads are not counted here: finding them reads every thread id in
        # checkpoints (seconds at a million threads, issue 14), on every page load. The
        # card says so and links to the list, which finds them page by page.
        counts: dict[str, Any] = dict(lgi.thread_status_counts(self.read(), untracked=False))
        counts["untracked"] = "not counted"
        with self.read().connection() as conn, conn.cursor(row_factory=_dict_row()) as cur:
            cur.execute(q.WORKERS_SQL)
            workers = [{**w, "note": dead_owner_note(w["owner"])} for w in cur.fetchall()]
            cur.execute(q.LEASES_SQL, (20,))
            # A lease whose owner is a dead process of this machine: noted (see
            # inspection.mark_dead_owner), as the counts above already count it.
            leases = [{**r, "note": dead_owner_note(r["owner"])} for r in cur.fetchall()]
        registered = self.workers()
        for w in [*workers, *leases]:
            w["note"] = w["note"] or registry_note(w["owner"], registered)
        self.sampler.sample(min_age=2.0)
        bars = [
            (s, float(counts[s]), f"/threads?state={s}") for s in STATES if isinstance(counts.get(s), int)
        ]
        clock = lambda t: dt.datetime.fromtimestamp(t).strftime("%H:%M:%S")  # noqa: E731
        charts = {
            "states": _svg.bar_chart(bars, title="threads by state"),
            "rate": _svg.line_chart(
                self.sampler.rate_points(), title="checkpoint writes per second", unit="/s",
                x_label=clock,
            ),
            "bytes": _svg.line_chart(
                self.sampler.bytes_points(), title="storage", fmt=_fmt_bytes, x_label=clock
            ),
        }
        quarantined = poison.list_quarantined(self.read(), limit=5)
        unknown = [e for e in Ledger(self.read()).entries(status="started", limit=200) if e.outcome_unknown]
        refresh = request.query_params.get("refresh", "")
        return self.render(
            request, "overview.html", refresh=int(refresh) if refresh.isdigit() else 0,
            counts=counts, states=STATES, workers=workers, registered=registered,
            leases=leases, charts=charts, quarantined=quarantined, unknown=unknown[:5],
            unknown_count=len(unknown),
        )

    def natural_sort(self) -> bool:
        """Whether the natural-order collation and its index exist (checked once)."""
        if self._natural is None:
            with self.read().connection() as conn, conn.cursor(row_factory=_dict_row()) as cur:
                cur.execute(q.NATURAL_AVAILABLE_SQL)
                row = cur.fetchone()
            self._natural = bool(row and row["ok"])
        return self._natural

    def workers(self) -> list[Any]:
        """The registered workers, live and dead (one bounded statement). Read on the
        primary, never a standby: a lagging heartbeat would show a live worker dead."""
        return list(control.list_workers(self.saver, include_dead=True, limit=100))

    def threads(self, request: Request) -> HTMLResponse:
        p = request.query_params
        state = p.get("state") or None
        if state is not None and state not in STATES and state not in _STATUSES:
            state = None  # as a bad number is: the page unfiltered (the filter menu lists the states)
        prefix = p.get("prefix") or None
        version = p.get("version") or None
        after = p.get("after") or None
        older = _hours(p.get("older_than_h"))
        newer = _hours(p.get("newer_than_h"))
        limit = min(max(int(p.get("limit") or PAGE), 1), 500)
        natural = p.get("sort") != "id" and state != "untracked" and self.natural_sort()
        if not natural and version is None and older is None and newer is None:
            rows = lgi.list_threads(
                self.read(), status=state, prefix=prefix, limit=limit + 1, after=after
            )
        else:
            params: dict[str, Any] = {
                "after": after, "prefix": prefix, "version": version, "older": older,
                "newer": newer, "status": state, "limit": limit + 1,
            }
            statement = q.THREADS_NATURAL_SQL if natural else q.THREADS_SQL
            with self.read().connection() as conn, conn.cursor(row_factory=_dict_row()) as cur:
                params["dead"] = lgi.dead_owners(conn, state)
                cur.execute(statement, params)
                rows = [lgi.mark_dead_owner(dict(r)) for r in cur.fetchall()]
            if natural and state == "running":
                rows = [r for r in rows if r["state"] == "running"]
        more = len(rows) > limit
        rows = lgi.open_last_errors(self.saver, rows[:limit])
        if any(r.get("state") == "running" for r in rows):
            registered = self.workers()
            for r in rows:
                note = registry_note(r.get("lease_owner"), registered) if r.get("state") == "running" else None
                if note:
                    r["state"], r["note"] = "recoverable", note
            if state == "running":  # a dead owner's lease is not what was asked for
                rows = [r for r in rows if r["state"] == "running"]
        next_url = None
        if more and rows:
            args = {k: v for k, v in p.items() if k != "after" and v}
            args["after"] = rows[-1]["thread_id"]
            next_url = "/threads?" + urlencode(args)
        return self.render(
            request, "threads.html", rows=rows, next_url=next_url, states=STATES,
            natural=natural, sort=p.get("sort") or "",
            f={"state": state or "", "prefix": prefix or "", "version": version or "",
               "older_than_h": p.get("older_than_h") or "", "newer_than_h": p.get("newer_than_h") or ""},
            first_url=(
                "/threads?" + urlencode({k: v for k, v in p.items() if k != "after" and v})
                if after else None
            ),
        )

    def thread(self, request: Request) -> HTMLResponse:
        p = request.query_params
        tid = p.get("id")
        if not tid:
            return self.error(request, 400, "missing thread", "give ?id=THREAD")
        info = lgi.show_thread(self.read(), tid, values=True)
        lease = info.get("lease")
        if lease and lease.get("live") and not lease.get("note"):
            # A live lease of a registered worker that stopped heartbeating (any host).
            lease["note"] = registry_note(lease.get("owner"), self.workers())
            if lease["note"] and info.get("state") == "running":
                info["state"] = "recoverable"
        history = lgi.thread_history(self.read(), tid, limit=min(int(p.get("history") or 50), 500))
        # The ledger table shows 100 rows; tool calls are linked among up to 500.
        ledger = Ledger(self.read()).entries(thread_id=tid, limit=500)
        trail = audit.list_audit(self.read(), thread_id=tid, limit=50)
        at = None
        if p.get("cp"):
            at = _state_at(self.read(), tid, lgi.resolve_checkpoint(self.read(), tid, p["cp"]))
        diff = None
        if p.get("a") and p.get("b"):
            diff = lgi.diff_checkpoints(self.read(), tid, p["a"], p["b"], values=True)
        found = _conversations(info, at, diff)
        nodes = {w["task_id"]: w["node"] for h in history for w in h["writes"]}
        self._link_ledger(tid, found, ledger, nodes)
        _durations(history)
        return self.render(
            request, "thread.html", t=info, history=history, has_graph=self.graph is not None, ledger=ledger[:100], trail=trail,
            at=at, diff=diff, a=p.get("a") or "", b=p.get("b") or "",
            failure=_failure(info),
        )

    def _link_ledger(
        self, tid: str, transcripts: list[dict[str, Any]], ledger: list[Any],
        task_nodes: dict[str, str | None],
    ) -> None:
        """Each tool call's ledger row, and the result it recorded (decoded, bounded)."""
        links = msg.ledger_links(tid, msg.tool_call_ids(transcripts), ledger, task_nodes)
        msg.attach_ledger(transcripts, links)
        recorded = self._recorded_results(sorted({e.key for e in links.values()}))
        for tr in transcripts:
            for turn in tr["turns"]:
                for call in turn["tool_calls"]:
                    if call["ledger"] is not None:
                        call["recorded"] = recorded.get(call["ledger"].key)

    def _recorded_results(self, keys: list[str]) -> dict[str, dict[str, Any]]:
        """The decoded results of completed ledger rows (one statement), as folded text;
        an undecodable one says so."""
        if not keys:
            return {}
        with self.read().connection() as conn, conn.cursor(row_factory=_dict_row()) as cur:
            cur.execute(q.LEDGER_RESULTS_SQL, (keys,))
            rows = cur.fetchall()
        out = {}
        for row in rows:
            try:
                value = self.read().serde.loads_typed((row["result_type"], bytes(row["result"] or b"")))
            except Exception as exc:  # a hostile or foreign row: shown, never fatal
                if decryption_error(exc, thread_id=None, where="") is not None:  # issue 27: no key
                    out[row["key"]] = msg.folded("(encrypted: start the console with --key-file)")
                    continue
                out[row["key"]] = msg.folded(f"(cannot decode the recorded result: {type(exc).__name__})")
            else:
                out[row["key"]] = msg.result_text(value)
        return out

    def quarantine(self, request: Request) -> HTMLResponse:
        entries = poison.list_quarantined(self.read(), limit=500)
        histories = {e.thread_id: poison.show(self.read(), e.thread_id, history=8).history for e in entries[:50]}
        # The rewind choice starts on the newest checkpoint before the quarantined one
        # (the head itself is a no-op, the quarantined one fails again).
        defaults = {}
        for e in entries[:50]:
            skip = {e.checkpoint_id, e.head_checkpoint_id}
            older = [h.checkpoint_id for h in histories[e.thread_id] if h.checkpoint_id not in skip]
            defaults[e.thread_id] = older[0] if older else None
        return self.render(
            request, "quarantine.html", entries=entries, histories=histories, defaults=defaults
        )

    def ledger(self, request: Request) -> HTMLResponse:
        show = request.query_params.get("show") or "unknown"
        status = {"unknown": "started", "started": "started"}.get(show, show if show != "all" else None)
        if status not in (None, "started", "completed", "failed"):
            status, show = "started", "unknown"
        entries = Ledger(self.read()).entries(status=status, limit=500)
        if show == "unknown":
            entries = [e for e in entries if e.outcome_unknown]
        return self.render(request, "ledger.html", entries=entries, show=show)

    def versions(self, request: Request) -> HTMLResponse:
        exact = request.query_params.get("exact") == "1"
        fast = self._version_summary()
        summary = versioning.version_summary(self.read()) if exact else fast
        names = self._version_names([g["graph_version"] for g in [*fast, *summary]])
        # The current version of each graph: ?current= for its graph, else the one its
        # newest thread started on (new threads start on the deployed code; old
        # versions' threads only resume). Versions with no recorded name are one graph.
        currents: dict[str | None, str | None] = {}
        for g in sorted(fast, key=lambda g: g["newest_thread"] or _EPOCH):
            currents[names.get(g["graph_version"])] = g["graph_version"]
        wanted = request.query_params.get("current")
        if wanted:
            currents[names.get(wanted)] = wanted
        for g in summary:
            g["graph_name"] = names.get(g["graph_version"])
            g["current"] = currents.get(g["graph_name"]) == g["graph_version"]
            g["current_version"] = currents.get(g["graph_name"])
        summary = sorted(summary, key=lambda g: (g["graph_name"] or "", not g["current"]))
        # Which live workers serve each version (one bounded statement per version
        # shown); a version with unfinished threads and none is warned about.
        for g in summary:
            g["served_by"] = list(control.workers_serving(self.saver, g["graph_version"]))
        drain = [g for g in summary if not g["current"] and g["unfinished"]]
        log = versioning.migration_log(self.read(), limit=30)
        dry = None
        p = request.query_params
        if self.graph is not None and p.get("from"):
            to = p.get("to") or currents.get(names.get(p["from"])) or None
            dry = versioning.migrate_threads(
                self.saver, p["from"], to, graph=self.graph,
                registry=self.registry, dry_run=True, limit=1000,
            )
        return self.render(
            request, "versions.html", summary=summary, drain=drain, log=log,
            dry=dry, has_graph=self.graph is not None, exact=exact,
            named=any(names.values()),
        )

    def _version_names(self, versions: list[str | None]) -> dict[str | None, str | None]:
        """version -> the graph name recorded with it (one statement, by primary key)."""
        wanted = sorted({v for v in versions if v})
        if not wanted:
            return {}
        with self.read().connection() as conn, conn.cursor(row_factory=_dict_row()) as cur:
            cur.execute(q.VERSION_NAMES_SQL, (wanted,))
            return {r["version"]: r["graph_name"] for r in cur.fetchall()}

    def _version_summary(self) -> list[dict[str, Any]]:
        """``versioning.version_summary``'s shape from durable_threads alone (fast)."""
        with self.read().connection() as conn, conn.cursor(row_factory=_dict_row()) as cur:
            cur.execute(q.VERSIONS_SQL)
            rows = cur.fetchall()
        return versioning.group_version_rows(rows)

    def storage(self, request: Request) -> HTMLResponse:
        p = request.query_params
        # pg_stat_user_tables' counters are each server's own (a standby's are empty):
        # the table list reads the primary; the heavy scans go to the reader.
        with self.saver.connection() as conn, conn.cursor(row_factory=_dict_row()) as cur:
            cur.execute(q.TABLE_SIZES_SQL)
            tables = cur.fetchall()
            _estimate_rows(cur, tables)
        largest = None
        if p.get("largest") == "1":
            with self.read().connection() as conn, conn.cursor(row_factory=_dict_row()) as cur:
                cur.execute(q.LARGEST_SQL, (15,))
                largest = cur.fetchall()
        stats = lgi.storage_stats(self.read()) if p.get("dedup", "1") != "0" else None
        report = None
        form = {
            "older_than_days": p.get("older_than_days") or "30",
            "keep_last": p.get("keep_last") or "",
            "statuses": p.get("statuses") or "done",
        }
        if p.get("dry_run"):
            keep = int(form["keep_last"]) if form["keep_last"] else None
            report = retention.retain(
                self.saver,
                older_than_days=float(form["older_than_days"]),
                keep_last=keep,
                statuses=[s.strip() for s in form["statuses"].split(",") if s.strip()],
                dry_run=True,
            )
        bars = [(t["name"], float(t["total_bytes"]), None) for t in tables[:8]]
        unit = _unit_for(max((int(t["total_bytes"]) for t in tables), default=0))
        return self.render(
            request, "storage.html", tables=tables, unit=unit, largest=largest, stats=stats, report=report,
            form=form, chart=_svg.bar_chart(bars, title="bytes per table"),
        )

    def audit_view(self, request: Request) -> HTMLResponse:
        p = request.query_params
        before = int(p["before"]) if p.get("before", "").isdigit() else None
        rows = audit.list_audit(
            self.read(), thread_id=p.get("thread") or None, action=p.get("action") or None,
            before=before, limit=PAGE + 1,
        )
        more = len(rows) > PAGE
        rows = rows[:PAGE]
        next_url = None
        if more:
            args = {k: v for k, v in p.items() if k != "before" and v}
            args["before"] = str(rows[-1]["id"])
            next_url = "/audit?" + urlencode(args)
        return self.render(
            request, "audit.html", rows=rows, next_url=next_url,
            f={"thread": p.get("thread") or "", "action": p.get("action") or ""},
        )

    # ---------------------------------------------------------------- actions
    def plan(self, action: str, form: Any) -> dict[str, Any]:
        """What ``action`` will change, for the confirmation page (read-only)."""
        if action in _decide.DECISIONS:
            return _decide.plan(
                self.saver, action, form, has_graph=self.graph is not None, archive_url=self.archive_url
            )
        if action in ("release", "rewind"):
            tid = str(form.get("thread") or "")
            report = poison.show(self.saver, tid, history=1)
            head = report.history[0].checkpoint_id if report.history else None
            plan: dict[str, Any] = {
                "thread": tid, "status": report.status, "attempts": report.attempts,
                "quarantine": report.quarantine, "head": head, "lease_owner": report.lease_owner,
            }
            if action == "rewind":
                to = lgi.resolve_checkpoint(self.saver, tid, str(form.get("to") or ""))
                if to == head:
                    raise _Refused(
                        f"{to} is the head of thread {tid!r}: a rewind to it changes nothing "
                        "(choose an earlier checkpoint, or release the thread)"
                    )
                plan["to"] = to
                plan["diff"] = lgi.diff_checkpoints(self.saver, tid, head, to) if head else None
            elif report.quarantine is None:
                raise _Refused(f"thread {tid!r} is not quarantined (status {report.status})")
            return plan
        key = str(form.get("key") or "")
        entry = Ledger(self.saver).get(key)
        if entry is None:
            raise _Refused(f"idempotency key {key!r} is not in the ledger")
        plan = {"key": key, "entry": entry}
        if action == "resolve":
            text = str(form.get("result") or "")
            if not text.strip():
                raise _Refused("the result box is empty: type the verified result as JSON "
                               "(a placeholder is never submitted)")
            try:
                plan["value"] = _decide.loads(text)
            except ValueError as exc:
                raise _Refused(f"the result is not valid JSON: {exc}") from None
            plan["result_text"] = text
        return plan

    def execute(self, action: str, form: Any, session: Session) -> tuple[str, str]:
        """Run ``action`` as ``session``'s operator; (message, where to go next)."""
        with audit.acting_as(session.actor, via="console"):
            if action in _decide.DECISIONS:
                return _decide.run(self.saver, action, form, self.runnable_graph(), self.archive_url)
            if action == "release":
                tid = str(form["thread"])
                entry = poison.release(self.saver, tid)
                return (f"released {tid} (checkpoint {entry.checkpoint_id}, "
                        f"{entry.attempts} attempts reset)", "/thread?id=" + quote(tid, safe=""))
            if action == "rewind":
                tid, to = str(form["thread"]), str(form["to"])
                r = poison.rewind(self.saver, tid, to)
                return (f"rewound {tid} to {to}: new head {r.checkpoint_id}",
                        "/thread?id=" + quote(tid, safe=""))
            key = str(form["key"])
            if action == "resolve":
                Ledger(self.saver).resolve(key, _decide.loads(str(form["result"])))
                return f"resolved {key}: the call will not run again", "/ledger"
            if Ledger(self.saver).forget(key):
                return f"forgot {key}: the next call runs the function", "/ledger"
            return f"{key} was not in the ledger", "/ledger"


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


_Refused = _decide.Refused


def registry_note(owner: str | None, workers: list[Any]) -> str | None:
    """A note for a live lease whose owner is a registered worker that is not alive
    (its heartbeat is older than its ttl, it stopped, or its pid is gone): the lease is a
    dead owner's, the thread is not running. None when the owner is alive or unregistered.
    A worker's runs hold leases named ``NAME:<run id>`` (recovery._owner)."""
    if not owner:
        return None
    # Exactly NAME:<run id>, never a prefix: a worker named like the host (or any
    # other owner's leading parts) must not claim every lease of that host (rev25).
    name = owner.rpartition(":")[0]
    mine = [w for w in workers if owner == w.worker_id or name in (w.name or w.worker_id, w.worker_id)]
    if not mine or any(w.alive for w in mine):
        return None
    w = mine[0]
    return (f"owner worker {w.name or w.worker_id} on {w.host} is dead (last heartbeat "
            f"{_abs_time(w.heartbeat_at)}); takeover when the lease expires")


def _dict_row() -> Any:
    from psycopg.rows import dict_row

    return dict_row


def _estimate_rows(cur: Any, tables: list[dict[str, Any]]) -> None:
    """Each table's row estimate, never unknown: pg_class.reltuples, or (-1: never
    vacuumed nor analyzed) an exact count for a small table, else the statistics'
    live-tuple count. ``rows_how`` says which, for the page's tooltip."""
    for t in tables:
        if int(t["rows_estimate"]) >= 0:
            t["rows_how"] = "planner estimate (pg_class.reltuples)"
        elif int(t["heap_bytes"]) <= q.SMALL_TABLE_BYTES:
            cur.execute(q.count_rows_sql(str(t["name"])))
            t["rows_estimate"], t["rows_how"] = int(cur.fetchone()["n"]), "counted (never analyzed)"
        else:
            t["rows_estimate"] = int(t["live_tuples"])
            t["rows_how"] = "live tuples (pg_stat_user_tables; never analyzed)"


_UNITS = (("B", 1), ("KiB", 1024), ("MiB", 1024**2), ("GiB", 1024**3), ("TiB", 1024**4))


def _unit_for(largest: int) -> tuple[str, int]:
    """One unit for a table of sizes: the largest that keeps the biggest value >= 1."""
    chosen = _UNITS[0]
    for unit in _UNITS:
        if largest >= unit[1]:
            chosen = unit
    return chosen


def _in_unit(n: Any, unit: tuple[str, int]) -> str:
    if n is None:
        return "-"
    name, size = unit
    return f"{int(n):,} {name}" if size == 1 else f"{float(n) / size:,.1f} {name}"


def _hours(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return float(value) * 3600.0
    except ValueError:
        return None


def _conversations(
    info: dict[str, Any], at: dict[str, Any] | None, diff: dict[str, Any] | None
) -> list[dict[str, Any]]:
    """Transcripts of the message lists the page shows (latest channels, state-at and its
    pending writes, the diff's after side), set on their rows; the decoded values are
    dropped once read (they are not rendered). Returns every transcript found."""
    found: list[dict[str, Any]] = []

    def take(row: dict[str, Any], key: str, out: str = "transcript") -> dict[str, Any] | None:
        tr = msg.transcript(row.pop(key, None))
        row[out] = tr
        if tr is not None:
            found.append(tr)
        return tr

    for ch in info.get("channels") or ():
        take(ch, "value")
    for part in (at or {}).get("channels", []) + (at or {}).get("pending", []):
        take(part, "value")
    for ch in (diff or {}).get("channels") or ():
        before = msg.transcript(ch.pop("value_a", None))
        after = take(ch, "value_b", "transcript_after")
        if after is not None:
            ch["common"] = msg.trim_common(before, after)
    return found


def _failure(info: dict[str, Any]) -> dict[str, Any] | None:
    """The thread's last recorded failure (lifecycle.failure_record), if any."""
    failure = info.get("last_failure")
    if isinstance(failure, str):  # a driver that hands JSONB back as text
        try:
            failure = json.loads(failure)
        except ValueError:
            return None
    return failure if isinstance(failure, dict) else None


def _durations(history: list[dict[str, Any]]) -> None:
    """Each checkpoint's step duration: the time since its parent (newest first)."""
    for h, older in zip(history, history[1:], strict=False):
        h["duration"] = _seconds_between(older.get("ts"), h.get("ts"))


def _seconds_between(a: Any, b: Any) -> float | None:
    try:
        ta, tb = (dt.datetime.fromisoformat(str(x)) for x in (a, b))
    except (TypeError, ValueError):
        return None
    return (tb - ta).total_seconds()


def _state_at(saver: DurablePostgresSaver, thread_id: str, checkpoint_id: str) -> dict[str, Any]:
    """The channel values of one checkpoint (decoded through the saver)."""
    saved = saver.get_tuple(
        {"configurable": {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": checkpoint_id}}
    )
    if saved is None:
        raise lgi.InspectError(
            f"no checkpoint {checkpoint_id!r} in thread {thread_id!r}", thread_id=thread_id
        )
    values = saved.checkpoint.get("channel_values") or {}
    md = dict(saved.metadata or {})
    return {
        "checkpoint_id": checkpoint_id,
        "step": md.get("step"),
        "source": md.get("source"),
        "channels": [
            {"channel": c, "type": type(v).__name__, "preview": lgi.preview(v, 400), "value": v}
            for c, v in sorted(values.items())
            if not lgi.is_internal(c)
        ],
        "pending": [
            {"task_id": t, "channel": c, "preview": lgi.preview(v, 200), "value": v}
            for t, c, v in saved.pending_writes or ()
        ],
    }


def _view(c: Console, fn: Callable[[Request], HTMLResponse]) -> Callable[[Request], Response]:
    def endpoint(request: Request) -> Response:
        return c.guard(request, lambda: fn(request))

    return endpoint

async def _login(c: Console, request: Request) -> Response:
    if not c.allow_actions:
        return c.error(request, 403, "read-only console",
                       "this console was started without --allow-actions: nothing to sign in to")
    nxt = request.query_params.get("next") or "/"
    if not nxt.startswith("/") or nxt.startswith("//") or "\\" in nxt:  # no open redirect
        nxt = "/"
    if request.method == "GET":
        return c.render(request, "login.html", next=nxt, failed=False)
    form = await request.form()
    if not c.sessions.check_token(str(form.get("token") or "")):
        return c.render(request, "login.html", status=403, next=nxt, failed=True)
    name = _short(form.get("name") or "operator", 60)
    client = request.client.host if request.client else "?"
    session = c.sessions.create(f"{name} ({client})")
    resp = RedirectResponse(nxt, status_code=303)
    resp.set_cookie(COOKIE, session.sid, httponly=True, samesite="strict", path="/")
    return resp

async def _logout(c: Console, request: Request) -> Response:
    form = await request.form()
    session = c.session(request)
    if session is not None and csrf_ok(session, form):
        c.sessions.drop(session.sid)
    resp = RedirectResponse("/", status_code=303)
    resp.delete_cookie(COOKIE, path="/")
    return resp

def _refuse(c: Console, request: Request, action: str) -> Response | None:
    if action not in ACTIONS:
        return c.error(request, 404, "no such action", action)
    if not c.allow_actions:
        return c.error(request, 403, "read-only console",
                       "this console was started without --allow-actions")
    return None

def _confirm(c: Console, request: Request) -> Response:
    action = request.path_params["action"]
    refused = _refuse(c, request, action)
    if refused is not None:
        return refused
    if c.session(request) is None:
        nxt = str(request.url.path) + ("?" + request.url.query if request.url.query else "")
        return RedirectResponse("/login?" + urlencode({"next": nxt}), status_code=303)
    try:
        plan = c.plan(action, request.query_params)
    except _Refused as exc:
        return c.error(request, 409, f"cannot {action}", str(exc))
    except DurableError as exc:
        return c.error(request, 404 if isinstance(exc, LookupError) else 400,
                       type(exc).__name__, exc.message)
    # The plan was read on the primary (Console.plan): no standby lag line above it.
    return c.render(request, "confirm.html", action=action, plan=plan, reading=None)

async def _act(c: Console, request: Request) -> Response:
    action = request.path_params["action"]
    refused = _refuse(c, request, action)
    if refused is not None:
        return refused
    origin = request.headers.get("origin")
    if origin and urlsplit(origin).netloc != request.headers.get("host"):
        return c.error(request, 403, "cross-origin request", f"refused a POST from {origin}")
    form = await request.form()
    session = c.session(request)
    if session is None:
        return c.error(request, 403, "not signed in", "sign in with the console token first")
    if not csrf_ok(session, form):
        return c.error(request, 403, "CSRF check failed",
                       "the form's token does not match this session: reload the page and retry")
    if form.get("confirmed") != "yes":
        return c.error(request, 400, "not confirmed", "actions are confirmed on their own page")

    def run() -> tuple[str, str]:
        try:
            return c.execute(action, form, session)
        finally:
            c.wrote()  # committed or not: the next pages read what the primary has

    from starlette.concurrency import run_in_threadpool

    try:
        message, where = await run_in_threadpool(run)
    except DurableError as exc:
        return c.error(request, 409, type(exc).__name__, exc.message)
    except (ValueError, KeyError) as exc:
        return c.error(request, 400, f"cannot {action}", str(exc))
    session.flash.append(message)
    return RedirectResponse(where, status_code=303)



def create_app(
    saver: DurablePostgresSaver,
    *,
    allow_actions: bool = False,
    token: str | None = None,
    sample_interval: float = 10.0,
    graph: Any = None,
    registry: Any = None,
    allowed_hosts: list[str] | None = None,
    archive_url: str | None = None,
) -> Starlette:
    """The console as an ASGI app on a set-up sync ``DurablePostgresSaver``.

    ``allow_actions``: enable release/rewind/resolve/forget (``token`` is then
    required). ``graph``: the current graph (builder or compiled), for the versions
    page's migrate dry-run, with ``registry`` (default: ``saver.migrations``).
    ``allowed_hosts``: the Host headers served (others get 400: a page of another site
    cannot reach the console through DNS rebinding); the CLI passes the loopback names."""
    c = Console(
        saver, allow_actions=allow_actions, token=token, sample_interval=sample_interval,
        graph=graph, registry=registry, archive_url=archive_url,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        c.sampler.sample()
        c.sampler.start()
        try:
            yield
        finally:
            c.sampler.stop()

    from importlib.resources import files

    static = str(files("langgraph_durable.console") / "static")
    routes = [
        Route("/", _view(c, c.overview)),
        Route("/threads", _view(c, c.threads)),
        Route("/thread", _view(c, c.thread)),
        Route("/quarantine", _view(c, c.quarantine)),
        Route("/ledger", _view(c, c.ledger)),
        Route("/versions", _view(c, c.versions)),
        Route("/storage", _view(c, c.storage)),
        Route("/audit", _view(c, c.audit_view)),
        Route("/login", partial(_login, c), methods=["GET", "POST"]),
        Route("/logout", partial(_logout, c), methods=["POST"]),
        Route("/confirm/{action}", partial(_confirm, c)),
        Route("/act/{action}", partial(_act, c), methods=["POST"]),
        Mount("/static", StaticFiles(directory=static), name="static"),
    ]
    middleware = []
    if allowed_hosts:
        from starlette.middleware import Middleware
        from starlette.middleware.trustedhost import TrustedHostMiddleware

        middleware.append(Middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts)))
    app = Starlette(routes=routes, lifespan=lifespan, middleware=middleware)
    app.state.console = c
    return app
