"""Where a 10-step invoke's time goes, durable vs stock, on ALL threads (issue 14).

LangGraph runs ``put`` / ``put_writes`` in a background executor and the loop waits for
them (each put after the previous one, and all of them at the run's exit), so a saver's
cost in those threads is on the invoke's critical path even though a profile of the main
thread shows it only as waiting. Two views, same database, the savers taking turns:

* ``--mode time`` (default): every saver method LangGraph calls is wrapped; per invoke,
  the summed wall and thread-CPU ms of each (in whichever thread ran it), and the
  invoke's own wall and process CPU. Durable minus stock per method is the attribution.
* ``--mode plain``: nothing wrapped; the invokes' wall and process CPU only.
* ``--mode calls``: Python function calls per invoke, all threads, per contender (a
  deterministic proxy for the client's CPU work, unaffected by a loaded machine).
* ``--mode profile``: cProfile (timer: thread CPU time) in every thread (``threading.setprofile`` starts one per
  new thread; LangGraph's executor threads are new per invoke), stats merged, top
  functions by own time printed for one contender.

Run: ``python bench/profile_invoke.py [--samples 200] [--mode profile --who durable]``.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import os
import pstats
import statistics
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))

from bench_hotpath import DEFAULT_DSN, build, connect, drop_db, make_db
from langgraph.checkpoint.postgres import PostgresSaver

from langgraph_durable import DurablePostgresSaver
from langgraph_durable import lifecycle as _lifecycle

_TIMES: dict[str, defaultdict[str, list[float]]] = {}
_CURRENT: list[str] = [""]


def _wrap(obj: Any, name: str, label: str) -> None:
    fn = getattr(obj, name)

    @functools.wraps(fn)
    def timed(*a: Any, **k: Any) -> Any:
        c0, t0 = time.thread_time(), time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            acc = _TIMES[_CURRENT[0]]
            acc[label].append((time.perf_counter() - t0) * 1000)
            acc[label + " cpu"].append((time.thread_time() - c0) * 1000)

    setattr(obj, name, timed)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsn", default=os.environ.get("BENCH_DSN", DEFAULT_DSN))
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--mode", choices=("plain", "time", "profile", "calls"), default="time")
    ap.add_argument("--who", default="durable")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--filter", default="durable|telemetry|prometheus|postgres/__init__")
    ap.add_argument("--durability", choices=("sync", "async"), default="async")
    args = ap.parse_args()
    dsn = make_db(args.dsn)
    try:
        with connect(dsn) as c:
            PostgresSaver(c).setup()
        with DurablePostgresSaver.from_conn_string(dsn) as s:
            s.setup()
        conns = {n: connect(dsn) for n in ("stock", "durable", "leases off")}
        savers: dict[str, Any] = {
            "stock": PostgresSaver(conns["stock"]),
            "durable": DurablePostgresSaver(conns["durable"]),
            "leases off": DurablePostgresSaver(conns["leases off"], leases=False),
        }
        if args.mode == "time":
            for n, s in savers.items():
                _TIMES[n] = defaultdict(list)
                for m in ("get_tuple", "put", "put_writes", "get_next_version"):
                    _wrap(s, m, m)
            # The run end (lease release) runs on the main thread in the loop's exit.
            orig_push = _lifecycle.RunLifecycle._push_exit

            def push_exit(self: Any, ctx: Any, lease: Any, restore: Any) -> None:
                orig_push(self, ctx, lease, restore)
                stack = ctx.loop.stack
                cb = stack._exit_callbacks.pop()
                is_sync, fn = cb

                def timed_exit(*a: Any) -> Any:
                    c0, t0 = time.thread_time(), time.perf_counter()
                    try:
                        return fn(*a)
                    finally:
                        acc = _TIMES[_CURRENT[0]]
                        acc["run end"].append((time.perf_counter() - t0) * 1000)
                        acc["run end cpu"].append((time.thread_time() - c0) * 1000)

                stack._exit_callbacks.append((is_sync, timed_exit))

            _lifecycle.RunLifecycle._push_exit = push_exit  # type: ignore[method-assign]
        graphs = {n: build().compile(checkpointer=s) for n, s in savers.items()}
        tag = uuid.uuid4().hex[:6]
        for name, g in graphs.items():
            _CURRENT[0] = name
            for i in range(10):
                g.invoke({"n": 0, "note": ""}, {"configurable": {"thread_id": f"w-{tag}-{name}-{i}"}},
                         durability=args.durability)
        if args.mode == "time":
            for acc in _TIMES.values():
                acc.clear()
        wall: dict[str, list[float]] = defaultdict(list)
        cpu: dict[str, list[float]] = defaultdict(list)
        profiles: list[cProfile.Profile] = []
        calls: dict[str, int] = defaultdict(int)
        per_fn: dict[str, Counter[str]] = defaultdict(Counter)
        for i in range(args.samples):
            for name, g in graphs.items():
                _CURRENT[0] = name
                cfg = {"configurable": {"thread_id": f"i-{tag}-{name}-{i}"}}
                prof = (args.mode == "profile" and name == args.who) or args.mode == "calls"
                if prof:
                    def starter(*_: Any) -> None:
                        p = cProfile.Profile(time.thread_time)
                        profiles.append(p)
                        p.enable()
                    threading.setprofile(starter)
                    main_p = cProfile.Profile(time.thread_time)
                    profiles.append(main_p)
                    main_p.enable()
                c0, t0 = time.process_time(), time.perf_counter()
                g.invoke({"n": 0, "note": ""}, cfg, durability=args.durability)
                wall[name].append((time.perf_counter() - t0) * 1000)
                cpu[name].append((time.process_time() - c0) * 1000)
                if prof:
                    main_p.disable()
                    threading.setprofile(None)  # type: ignore[arg-type]
                    if args.mode == "calls":
                        for p in profiles:
                            st = pstats.Stats(p)
                            calls[name] += st.total_calls
                            for (file, line, func), v in st.stats.items():  # type: ignore[attr-defined]
                                per_fn[name][f"{file.split('site-packages/')[-1]}:{line}({func})"] += v[1]
                        profiles.clear()
        print(f"load {os.getloadavg()}  samples {args.samples}")
        for n in graphs:
            w, c = wall[n], cpu[n]
            print(f"{n:11} wall median {statistics.median(w):6.2f} min {min(w):6.2f}  "
                  f"cpu median {statistics.median(c):6.2f} min {min(c):6.2f}")
        if args.mode == "calls":
            print("\nPython function calls per invoke (all threads):")
            for n in graphs:
                print(f"{n:11} {calls[n] / args.samples:8.0f}  ({calls[n] / max(calls['stock'], 1):.2f}x stock)")
            a, b = per_fn[args.who], per_fn["stock"]
            diff = sorted(set(a) | set(b), key=lambda k: -abs(a[k] - b[k]))[: args.top]
            print(f"\nlargest differences, {args.who} minus stock, calls per invoke:")
            for k in diff:
                print(f"{(a[k] - b[k]) / args.samples:+8.1f}  {k}")
        if args.mode == "time":
            labels = sorted({k for acc in _TIMES.values() for k in acc})
            print("\nper invoke, summed over calls (median of per-call x calls per invoke):")
            print(f"{'':22}" + "".join(f"{n:>14}" for n in graphs))
            for lab in labels:
                row = []
                for n in graphs:
                    v = _TIMES[n].get(lab, [])
                    per = len(v) / args.samples
                    row.append(f"{(statistics.median(v) * per if v else 0):8.3f} x{per:4.1f}")
                print(f"{lab:22}" + "".join(f"{r:>14}" for r in row))
        elif profiles:
            st = pstats.Stats(profiles[0])
            for p in profiles[1:]:
                try:
                    st.add(p)
                except TypeError:
                    pass
            # Timer: thread CPU time (a wall-clock profile on a shared machine charges
            # the other sessions' load to whatever was running).
            st.sort_stats("tottime").print_stats(args.top)
            st.sort_stats("cumulative").print_stats(args.filter, args.top)
        for c in conns.values():
            c.close()
    finally:
        drop_db(args.dsn, dsn)
    return 0


if __name__ == "__main__":
    sys.exit(main())
