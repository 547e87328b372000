"""Every use of non-public third-party API by the gateway, in one place.

``tests/gateway/test_toolkit_seams.py`` pins each of these; if agentcore-rl-toolkit (0.2.x),
transformers or the SageMaker SDK change under us, that test fails first.

1. ``BaseAdapter.store`` / ``inflight``: the adapters keep per-sid ``Session`` state
   (sampling defaults, ``max_context_tokens``) in a dict they ``setdefault`` on every turn.
   We swap in a mapping that answers from the current request's session record, so no
   session state lives in a container's memory, and we drop the adapter's per-sid
   in-flight bookkeeping after each request so a long-lived container does not grow.
2. toolkit 0.2.0 x transformers: ``HfTemplateRenderer`` parses model output with
   ``tokenizer.parse_response(text, schema=<legacy response_schema>)``, a format transformers
   5.13 replaced. ``pyproject.toml`` pins ``transformers<5.13`` (the toolkit's own line), and
   ``tests/gateway/test_transformers_parsing.py`` fails if an upgrade slips past the pin.
3. SageMaker SDK ``SamplingClient._retire``: a directly constructed client owns a
   background submitter thread; retiring it when it leaves our cache stops the thread.
4. ``BaseAdapter._session_id`` (a documented wire hook): ``app.py``'s adapter subclasses
   return the sid the guard authenticated, so both protocols agree on bearer vs x-api-key.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable
from importlib.metadata import version
from typing import Any

from agentcore_rl_toolkit.rollout_gateway.adapters.common import BaseAdapter, Session

logger = logging.getLogger(__name__)

#: The toolkit line these seams were written against (pyproject pins ``==0.2.*``).
SUPPORTED_TOOLKIT = "0.2."


def toolkit_version() -> str:
    """The installed agentcore-rl-toolkit version."""
    return version("agentcore-rl-toolkit")


def check_toolkit_version() -> None:
    """Raise RuntimeError if the installed toolkit is not the line these seams target."""
    found = toolkit_version()
    if not found.startswith(SUPPORTED_TOOLKIT):
        raise RuntimeError(
            f"stepwise.gateway was written against agentcore-rl-toolkit {SUPPORTED_TOOLKIT}x, found {found}; "
            "re-check stepwise/gateway/_toolkit.py and its test"
        )


# --- 1. request-scoped adapter session state ---------------------------------------


class RequestScopedSessions(dict):
    """Stands in for ``BaseAdapter.store``: ``setdefault(sid, ...)`` (the only access on
    the turn path) returns the ``Session`` of the request being served.

    ``current`` returns ``(sid, Session)`` for the request in progress, or None outside one.
    """

    def __init__(self, current: Callable[[], tuple[str, Session] | None]) -> None:
        super().__init__()
        self._current = current

    def setdefault(self, sid: str, default: Any = None) -> Any:  # type: ignore[override]
        scoped = self._current()
        if scoped is not None and scoped[0] == sid:
            return scoped[1]
        return super().setdefault(sid, default)


def install_request_scoped_sessions(adapter: BaseAdapter, current: Callable[[], tuple[str, Session] | None]) -> None:
    """Make ``adapter`` read per-sid session state from the current request."""
    adapter.store = RequestScopedSessions(current)


def release_sid(adapter: BaseAdapter, sid: str) -> None:
    """Forget the adapter's per-sid in-flight set once no turn of ``sid`` is in flight here."""
    tasks = adapter.inflight.get(sid)
    if tasks is not None and not tasks:
        adapter.inflight.pop(sid, None)


def make_session(sampling_defaults: dict, max_context_tokens: int) -> Session:
    """The adapters' per-sid ``Session`` value."""
    return Session(sampling_defaults=dict(sampling_defaults), max_context_tokens=int(max_context_tokens or 0))


# --- 3. SageMaker SDK sampling client ------------------------------------------------


def retire_sampling_client(client: Any) -> None:
    """Stop a directly constructed ``SamplingClient``'s background submitter thread.

    Never calls ``stop()`` or ``__exit__``: a client built without a session handle
    believes it owns the session and would try to stop it.
    """
    retire = getattr(client, "_retire", None)
    if callable(retire):
        try:
            retire()
        except Exception:  # best effort; the thread is a daemon
            logger.debug("retiring a sampling client failed", exc_info=True)


# --- context helper ------------------------------------------------------------------


def scoped_lookup(var: contextvars.ContextVar) -> Callable[[], tuple[str, Session] | None]:
    """``current`` for :class:`RequestScopedSessions` from a context var holding an object
    with ``.sid`` and ``.adapter_session``."""

    def current() -> tuple[str, Session] | None:
        scope = var.get(None)
        return None if scope is None else (scope.sid, scope.adapter_session)

    return current
