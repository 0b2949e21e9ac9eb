"""``langgraph-durable demo``: a research pipeline killed with SIGKILL and resumed.

The story of the package in one run. A customer orders a research report; the
pipeline plans, fetches sources, runs four analyses in parallel, charges the customer,
drafts three sections in parallel, assembles the report and emails it. The demo

1. starts a worker process (``python -m langgraph_durable.cli.demo worker``) that runs the
   graph on a ``DurablePostgresSaver``, and a second one as a standby (imported and
   connected, it does not touch the thread until told to);
2. kills worker 1 with a real SIGKILL while a draft section is half written (after its
   sibling sections finished and their writes reached Postgres);
3. tells worker 2 to resume: it meets the dead worker's lease (``ThreadBusyError``),
   waits for it to expire (the fencing that stops two workers from running one
   thread) and resumes with ``graph.invoke(None, config)``;
4. shows, live, which steps were restored from the checkpoint and which ran, and
   counts the payments in a table: the customer is charged exactly once.

Workers report progress as JSON lines on stdout; every step execution is also logged
in ``lgd_demo_step_runs``, so the final verdict comes from the database, not from
what the display saw. Side effects go to ``lgd_demo_payments`` / ``lgd_demo_emails``,
tables that do not deduplicate: a second charge would show up as a second row.

The parts: ``story`` (the pipeline: nodes, side effects, the graph), ``worker`` (the
process that runs it), ``driver`` (spawns, kills and resumes the workers, and sums up
from the database), ``render`` (the live table).
"""

from langgraph_durable.cli.demo.driver import DemoError, run_demo, summarize
from langgraph_durable.cli.demo.story import STEPS, killable

__all__ = ["STEPS", "DemoError", "killable", "run_demo", "summarize"]
