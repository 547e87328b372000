"""The rollout's heartbeat: the gateway sees every LLM call of a rollout, so it tells Step Functions the
rollout is alive (``SendTaskHeartbeat`` for the task whose token the session record holds).

Per session, at most one heartbeat per `stepwise.core.liveness.heartbeat_interval` of the record's
``heartbeat_seconds`` (per container: several containers serving one session may each send one), one
when a call is admitted and one every interval while it is in flight (a long sample is not silence).
The heartbeat runs beside the request, never on its path: a slow or failing ``SendTaskHeartbeat`` only
delays the next beat. A task that has ended (``TaskTimedOut``, ``TaskDoesNotExist``, ``InvalidToken``)
is not beaten again. The token is never logged.

Source: Step Functions API reference, ``SendTaskHeartbeat`` ("resets the Heartbeat clock"; the
task's ``HeartbeatSeconds``); the callback pattern's best practice (developer guide, "Using timeouts
to avoid stuck executions": set ``HeartbeatSeconds`` on ``.waitForTaskToken`` tasks).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from typing import Any

from stepwise.core.liveness import heartbeat_interval
from stepwise.records import SessionRecord

log = logging.getLogger(__name__)

#: The session record's field holding the rollout's task token (StartRollout writes it).
TASK_TOKEN_FIELD = "task_token"
#: SendTaskHeartbeat errors that mean the task is over: no more heartbeats for it.
TASK_GONE = ("TaskTimedOut", "TaskDoesNotExist", "InvalidToken")


def default_client_factory(region: str | None) -> Any:
    """A Step Functions client in ``region`` (the stack's: the run's region is the state machine's)."""
    import boto3

    from stepwise.aws.clients import client_config

    return boto3.client("stepfunctions", region_name=region or None, config=client_config())


class TaskHeartbeats:
    """Heartbeats of the rollouts' tasks, sent beside the requests (module doc).

    Args:
        client_factory: region -> Step Functions client (one is made per region and kept).
        clock: monotonic seconds.
        max_sessions: sessions remembered (least recently beaten forgotten first).
    """

    def __init__(self, client_factory: Callable[[str | None], Any] = default_client_factory,
                 clock: Callable[[], float] = time.monotonic, max_sessions: int = 4096) -> None:
        self.client_factory = client_factory
        self.clock = clock
        self.max_sessions = max_sessions
        self._clients: dict[str | None, Any] = {}
        self._last: OrderedDict[str, float] = OrderedDict()
        self._gone: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()
        self.sent = 0
        self.failed = 0

    def _client(self, region: str | None) -> Any:
        with self._lock:
            if region not in self._clients:
                self._clients[region] = self.client_factory(region)
            return self._clients[region]

    def _claim(self, sid: str, token: str, interval: float) -> bool:
        """Whether a heartbeat of ``sid`` (its task ``token``) is due now; if so, it counts as sent from now."""
        now = self.clock()
        with self._lock:
            if token in self._gone:
                return False
            last = self._last.get(sid)
            if last is not None and now - last < interval:
                return False
            self._last[sid] = now
            self._last.move_to_end(sid)
            while len(self._last) > self.max_sessions:
                self._last.popitem(last=False)
            return True

    def send(self, record: SessionRecord) -> bool:
        """One SendTaskHeartbeat for ``record``'s task, if one is due (blocking; run it off the request's
        path). True when it was sent. Never raises."""
        token = (record.model_extra or {}).get(TASK_TOKEN_FIELD)
        if not token or record.heartbeat_seconds <= 0:
            return False
        if not self._claim(record.sid, str(token), heartbeat_interval(record.heartbeat_seconds)):
            return False
        try:
            self._client(record.region).send_task_heartbeat(taskToken=str(token))
        except Exception as exc:  # the token stays out of the log
            response = getattr(exc, "response", None)
            code = response.get("Error", {}).get("Code", "") if isinstance(response, dict) else ""
            if code in TASK_GONE or type(exc).__name__ in TASK_GONE:
                with self._lock:  # this token's task: a re-check waits on with a new token in the record
                    self._gone[str(token)] = None
                    while len(self._gone) > self.max_sessions:
                        self._gone.popitem(last=False)
            else:
                with self._lock:
                    self.failed += 1
                log.warning("rollout heartbeat failed: %s %s", type(exc).__name__, code)
            return False
        with self._lock:
            self.sent += 1
        return True

    @contextlib.asynccontextmanager
    async def during(self, record: SessionRecord) -> AsyncIterator[None]:
        """While the body runs (an admitted LLM call), heartbeat ``record``'s task now if due and every
        interval after, from a background task the request never waits for."""
        if record.heartbeat_seconds <= 0 or not (record.model_extra or {}).get(TASK_TOKEN_FIELD):
            yield
            return
        interval = heartbeat_interval(record.heartbeat_seconds)

        async def beat() -> None:
            while True:
                await asyncio.to_thread(self.send, record)
                await asyncio.sleep(interval)

        task = asyncio.get_running_loop().create_task(beat())
        try:
            yield
        finally:
            task.cancel()
