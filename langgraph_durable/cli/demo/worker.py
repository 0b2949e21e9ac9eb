"""A demo worker process (``python -m langgraph_durable.cli.demo worker``): starts the
run, or stands by and resumes it after the first worker was killed."""


from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from langgraph_durable.cli.demo import story
from langgraph_durable.cli.demo.story import (
    CUSTOMER,
    DEFAULT_LEASE_TTL,
    TOPIC,
    _WorkerContext,
    build_graph,
)
from langgraph_durable.embedded import ENV_DSN


def worker_main(argv: list[str] | None = None) -> int:
    """Entry point of a worker process: start the run, or resume it."""
    parser = argparse.ArgumentParser(prog="python -m langgraph_durable.cli.demo worker")
    parser.add_argument("--thread-id", required=True)
    parser.add_argument("--phase", choices=("start", "resume"), required=True)
    parser.add_argument("--lease-ttl", type=float, default=DEFAULT_LEASE_TTL)
    parser.add_argument("--speed", type=float, default=1.0)
    args = parser.parse_args(argv)
    # The DSN comes through the environment, not argv: argv is visible to every user
    # of the machine (ps), and a DSN may carry a password.
    dsn = os.environ.get(ENV_DSN)
    if not dsn:
        print(f"{ENV_DSN} is not set", file=sys.stderr)
        return 2
    # The nodes find the context through story._ctx(): set it there.
    ctx = story._CTX = _WorkerContext(
        dsn=dsn, worker=1 if args.phase == "start" else 2, speed=args.speed
    )

    from langgraph_durable import DurablePostgresSaver, ThreadBusyError

    builder, guarded = build_graph()
    ctx.emit("worker", pid=os.getpid(), phase=args.phase, idempotent=guarded)
    config: Any = {"configurable": {"thread_id": args.thread_id}}
    with DurablePostgresSaver.from_conn_string(dsn, lease_ttl=args.lease_ttl) as saver:
        graph = builder.compile(checkpointer=saver)
        if args.phase == "start":
            graph.invoke(
                {"topic": TOPIC, "customer": CUSTOMER, "log": []}, config, durability="sync"
            )
        else:
            # Standby: everything is imported and connected; wait for the driver's
            # "go" (sent right after the SIGKILL), so the resume meets the dead
            # worker's lease however slow this machine starts Python.
            ctx.emit("ready")
            if sys.stdin.readline().strip() != "go":
                return 0
            snapshot = graph.get_state(config)
            ctx.emit(
                "loaded",
                step=(snapshot.metadata or {}).get("step"),
                next=list(snapshot.next),
                finished=[t.name for t in snapshot.tasks if t.result is not None],
                completed=list((snapshot.values or {}).get("log", [])),
            )
            # A lease that outlives several TTLs belongs to a live worker, not the
            # dead one: give up rather than wait forever.
            give_up = time.monotonic() + 4 * args.lease_ttl + 10
            while True:
                try:
                    graph.invoke(None, config, durability="sync")
                    break
                except ThreadBusyError as exc:
                    if time.monotonic() > give_up:
                        raise
                    # The killed worker's lease is still live: no second worker may run
                    # this thread until it expires (fencing). Wait, then take over.
                    left = float(getattr(exc, "expires_in", None) or 0.0)
                    ctx.emit("busy", expires_in=left, owner=getattr(exc, "owner", None))
                    time.sleep(min(max(left, 0.05), 0.25))
        final = graph.get_state(config)
        ctx.emit(
            "finished",
            report_chars=len((final.values or {}).get("report", "")),
            next=list(final.next),
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["worker"]:
        return worker_main(argv[1:])
    print("usage: python -m langgraph_durable.cli.demo worker ... (run `langgraph-durable demo`)")
    return 2
