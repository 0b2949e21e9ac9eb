"""A small research assistant graph for LangGraph Studio.

plan -> research -> write -> review --(needs more)--> research
                                    \\--(approved)----> END

No model and no network: ``research`` looks the sub-questions up in a tiny built-in
library, so the example runs anywhere and every run is reproducible. ``delay`` in the
input makes ``research`` take that many seconds per round (to watch a run in flight in
Studio, or to interrupt/roll it back).

The graph is compiled without a checkpointer: the server supplies the one configured in
``langgraph.json`` (``./checkpointer.py:make_checkpointer``).
"""

from __future__ import annotations

import asyncio
import operator
import re
from typing import Annotated, TypedDict

from langgraph.graph import END, START, StateGraph

LIBRARY: dict[str, str] = {
    "checkpoint": "A checkpoint is a snapshot of the graph state saved after every superstep.",
    "durable": "Durable execution resumes a workflow from its last recorded step after a crash.",
    "postgres": "PostgreSQL stores checkpoints transactionally; one database serves many workers.",
    "lease": "A lease gives one worker the right to run a thread; fencing tokens reject stale writers.",
    "version": "Checkpoints are stamped with the graph version; a mismatch is refused or migrated.",
    "idempotent": "An idempotency key makes a side effect happen once even if a node runs again.",
    "poison": "A thread that fails on every resume is quarantined instead of crash-looping.",
    "storage": "Large values are stored once as content-addressed artifacts instead of per step.",
}
STOPWORDS = {"a", "an", "and", "the", "of", "to", "how", "what", "why", "does", "do", "is", "in"}


class ResearchState(TypedDict, total=False):
    question: str
    delay: float
    queries: list[str]
    notes: Annotated[list[str], operator.add]
    draft: str
    verdict: str
    rounds: int


def _words(text: str) -> list[str]:
    return [w for w in re.findall(r"[a-z]+", text.lower()) if w not in STOPWORDS]


def plan(state: ResearchState) -> ResearchState:
    """Split the question into sub-queries (one per content word, at most four)."""
    words = _words(state.get("question", "")) or ["durable"]
    return {"queries": words[:4], "rounds": 0}


async def research(state: ResearchState) -> ResearchState:
    """Look every query up in the library; a second round broadens to related topics."""
    delay = float(state.get("delay") or 0.0)
    if delay > 0:
        await asyncio.sleep(delay)
    rounds = state.get("rounds", 0)
    known = set(state.get("notes") or [])
    found: list[str] = []
    for query in state.get("queries") or []:
        for topic, text in LIBRARY.items():
            hit = topic.startswith(query[:5]) or (rounds > 0 and query[:4] in text.lower())
            if hit and text not in known and text not in found:
                found.append(text)
    return {"notes": found, "rounds": rounds + 1}


def write(state: ResearchState) -> ResearchState:
    notes = state.get("notes") or []
    body = " ".join(notes) if notes else "Nothing in the library matches the question."
    return {"draft": f"Q: {state.get('question', '')}\nA: {body}"}


def review(state: ResearchState) -> ResearchState:
    enough = len(state.get("notes") or []) >= 2
    out_of_rounds = state.get("rounds", 0) >= 2
    return {"verdict": "approved" if enough or out_of_rounds else "needs more"}


def route(state: ResearchState) -> str:
    return "research" if state.get("verdict") == "needs more" else END


builder = StateGraph(ResearchState)
builder.add_node("plan", plan)
builder.add_node("research", research)
builder.add_node("write", write)
builder.add_node("review", review)
builder.add_edge(START, "plan")
builder.add_edge("plan", "research")
builder.add_edge("research", "write")
builder.add_edge("write", "review")
builder.add_conditional_edges("review", route, ["research", END])

graph = builder.compile()
graph.name = "research_assistant"
