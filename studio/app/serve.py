"""Serving the studio: gradio's server with the OpenAI images API on the same port (FastAPI's `routes` through
gradio's `app_kwargs`, so both share the server and queue), the MCP server, and the door's middleware."""

from __future__ import annotations

import gradio as gr
from gradio.utils import LRUCache
from starlette.middleware import Middleware

from studio.app.access import KeyGate
from studio.app.bounds import MB, BodyCap, UploadCount, WaitingCap
from studio.report.card import CSS
from studio.spec.settings import current


def launch(demo: gr.Blocks, *, mcp: bool | None = None, **kwargs):
    """`demo.launch(**kwargs)` with the OpenAI routes (`demo.studio_api`) and gradio's MCP server when `mcp` (None:
    STUDIO_MCP)."""
    mcp = current().mcp if mcp is None else mcp
    kwargs.setdefault("css", CSS)
    settings = current()
    gate = Middleware(KeyGate, key=settings.api_key, open_page=settings.open_page)  # the first: before any reading
    api_cap = (("/v1/", int(settings.max_api_body_kb * 1024), "STUDIO_MAX_API_BODY_KB"),)
    cap = Middleware(BodyCap, max_bytes=int(settings.max_body_mb * MB), routes=api_cap)  # before any body is read
    studio = demo.studio_api.studio
    public = studio.guard is not None  # a public studio counts what its visitors do
    uploads = Middleware(
        UploadCount, count=studio.wrote_scope if public else None, max_bytes=int(settings.max_upload_mb * MB)
    )
    waiting = Middleware(
        WaitingCap,
        who=studio.visitor_scope if public else None,
        queued=lambda who: queued(demo, studio, who),
        most=settings.waiting_per_visitor,
        internal=studio.internal_scope if public else None,
    )
    middleware = [gate, cap, uploads, waiting]
    app_kwargs = {"routes": demo.studio_api.routes(), "middleware": middleware, **kwargs.pop("app_kwargs", {})}
    kwargs.setdefault("state_session_capacity", settings.sessions)  # sessions whose state stays in memory
    keep_waiting_sessions(demo)
    return demo.launch(app_kwargs=app_kwargs, mcp_server=mcp, **kwargs)


def queued(demo: gr.Blocks, studio, who: str) -> int:
    """How many events of visitor `who` wait in `demo`'s queue now (for app.bounds.WaitingCap)."""
    waiting = demo._queue.event_queue_per_concurrency_id.values()
    return sum(
        1
        for line in waiting
        for event in line.queue
        if not studio.internal(event.request) and studio.visitor(event.request) == who
    )


class SessionQueues(LRUCache):
    """gradio's per-session message queues (`Queue.pending_messages_per_session`) that, when full, drop the oldest IDLE
    session, never one with an event pending: gradio's own LRU drops busy ones and its queue loop dies of the
    KeyError (docs/library-behaviour.md G19)."""

    def __init__(self, queue, max_size: int):
        super().__init__(max_size)
        self.queue = queue

    def __setitem__(self, key, value) -> None:
        if key not in self and len(self) >= self.max_size:
            pending = self.queue.pending_event_ids_session
            idle = next((k for k in self if not pending.get(k)), None)
            if idle is not None:  # otherwise every session is busy: gradio's rule (the oldest) decides
                del self[idle]
                pending.pop(idle, None)
        super().__setitem__(key, value)


def keep_waiting_sessions(demo: gr.Blocks) -> None:
    """Put SessionQueues in place of the queue's per-session message queues (before it serves)."""
    q = demo._queue
    if isinstance(q.pending_messages_per_session, SessionQueues):
        return
    kept = SessionQueues(q, q.pending_messages_per_session.max_size)
    kept.update(q.pending_messages_per_session)
    q.pending_messages_per_session = kept
