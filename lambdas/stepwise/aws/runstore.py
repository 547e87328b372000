"""The S3 run store: JSON objects and the run state with conditional writes.

Keys come from `stepwise.layout` and records from `stepwise.records`. `RunState` writes use S3
conditional requests (``IfMatch`` on the ETag read, ``IfNoneMatch="*"`` for the first write);
moto 5.2.5 honours both with ``PreconditionFailed`` like S3 does.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

import boto3
from botocore.exceptions import ClientError
from pydantic import BaseModel

from stepwise import metering
from stepwise.core.sweeping import RunOwnedElsewhere  # noqa: F401  (raised here; the ownership rules' error)
from stepwise.layout import RUNS_PREFIX, BULK_TAGGING, buffer_key, rollouts_prefix, start_marker_key, state_key
from stepwise.records import GroupBuffer, RolloutRecord, RunState

T = TypeVar("T")


class RunStoreError(RuntimeError):
    """Base class of run-store errors."""


class RunNotFound(RunStoreError):
    """``runs/{run_id}/state.json`` does not exist."""


class StateConflict(RunStoreError):
    """The state changed under us more often than the retry budget allows."""


class ObjectTooLarge(RunStoreError):
    """An object is longer than the caller reads (`RunStore.get_json_bounded`): ``key`` and ``size`` (bytes)."""

    def __init__(self, key: str, size: int) -> None:
        super().__init__(f"{key} is {size} bytes")
        self.key, self.size = key, size


def _object_size(resp: dict[str, Any]) -> int:
    """An object's whole length from a (ranged) GetObject answer: ``ContentRange``'s ``/TOTAL``, else the
    answer's ``ContentLength`` (S3 leaves ``ContentRange`` out when the range covers the whole object)."""
    total = str(resp.get("ContentRange") or "").rpartition("/")[2]
    return int(total) if total.isdigit() else int(resp.get("ContentLength") or 0)


class RunStore:
    """JSON objects and the run state in the run bucket.

    Args:
        bucket: the run bucket (``STEPWISE_BUCKET``).
        s3: a boto3 S3 client; default ``boto3.client("s3")`` with `stepwise.aws.clients.client_config`.
    """

    def __init__(self, bucket: str, s3: Any = None) -> None:
        if not bucket:
            raise ValueError("RunStore needs a bucket name (STEPWISE_BUCKET is empty)")
        self.bucket = bucket
        if s3 is None:
            from stepwise.aws.clients import client_config

            s3 = boto3.client("s3", config=client_config())
        self.s3 = metering.install_s3_counter(s3)

    # -- plain objects

    def get_json(self, key: str) -> Any:
        """The JSON object at ``key``. Raises KeyError(key) when absent."""
        return self.get_json_etag(key)[0]

    def get_json_etag(self, key: str) -> tuple[Any, str]:
        obj, etag, _ = self.get_json_meta(key)
        return obj, etag

    def get_json_meta(self, key: str) -> tuple[Any, str, float]:
        """``(object, ETag, LastModified as epoch seconds)``. Raises KeyError(key) when absent."""
        try:
            resp = self.s3.get_object(Bucket=self.bucket, Key=key)
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                raise KeyError(key) from None
            raise
        modified = resp.get("LastModified")
        return json.loads(resp["Body"].read()), resp["ETag"], modified.timestamp() if modified is not None else 0.0

    def get_json_many(self, keys: list[str], parse: Callable[[Any], Any] | None = None, *,
                      concurrency: int | None = None) -> list[Any]:
        """The JSON objects at ``keys``, in their order, read ``concurrency`` GETs at a time (default and
        most: the client's connection pool, ``max_pool_connections``; more threads than connections would
        open and drop a connection per request) through `stepwise.concurrency.run_until`. ``parse``
        (optional) turns each object into what is kept, in the reading thread, so at most ``concurrency``
        raw objects are held at once beside the parsed ones. Every GET is counted for the invocation that
        asked (`stepwise.metering`: each read runs in a copy of the caller's context).

        Raises:
            KeyError: a key is absent (the first one met); the reads in flight are abandoned.
            Whatever ``parse`` or a GET raises.
        """
        import contextvars
        import math

        from stepwise.concurrency import run_until

        def one(item: tuple[int, str, contextvars.Context]) -> Any:
            _, key, ctx = item
            return ctx.run(lambda: parse(self.get_json(key)) if parse is not None else self.get_json(key))

        config = getattr(getattr(self.s3, "meta", None), "config", None)
        pool = int(getattr(config, "max_pool_connections", None) or 10)
        items = [(i, key, contextvars.copy_context()) for i, key in enumerate(keys)]
        out: list[Any] = [None] * len(keys)
        workers = max(1, min(len(keys), concurrency or pool, pool))
        for done in run_until(items, one, workers=workers, deadline=math.inf):
            if done.error is not None:
                raise done.error
            out[done.item[0]] = done.result
        return out

    def get_json_bounded(self, key: str, max_bytes: int) -> Any:
        """The JSON object at ``key`` when it is at most ``max_bytes`` long, read with one ranged GET (never
        more than ``max_bytes + 1`` bytes are transferred or held).

        Raises:
            KeyError(key): the object is absent.
            ObjectTooLarge: it is longer (``size``: its length).
            ValueError: it is not JSON (json's error), as `get_json`.
        """
        try:
            resp = self.s3.get_object(Bucket=self.bucket, Key=key, Range=f"bytes=0-{max_bytes}")
        except ClientError as e:
            code = e.response.get("Error", {}).get("Code")
            if code in ("NoSuchKey", "404"):
                raise KeyError(key) from None
            if code != "InvalidRange":  # an empty object has no byte 0: read it whole (it is empty)
                raise
            return self.get_json(key)
        size = _object_size(resp)
        if size > max_bytes:
            resp["Body"].close()
            raise ObjectTooLarge(key, size)
        return json.loads(resp["Body"].read(max_bytes + 1))

    def get_json_or(self, key: str, default: Any = None) -> Any:
        try:
            return self.get_json(key)
        except KeyError:
            return default

    def put_json(
        self, key: str, obj: Any, *, if_match: str | None = None, if_none_match: bool = False, bulk: bool = False
    ) -> str:
        """Write ``obj`` as JSON; returns the new ETag. Conditional writes raise ClientError PreconditionFailed.

        ``bulk=True`` tags the object ``stepwise-class=bulk`` (Map items, rollout records, datums):
        the stack's lifecycle rule expires those; config, state and summaries are never tagged.
        """
        kwargs: dict[str, Any] = {}
        if bulk:
            kwargs["Tagging"] = BULK_TAGGING
        if if_match is not None:
            kwargs["IfMatch"] = if_match
        if if_none_match:
            kwargs["IfNoneMatch"] = "*"
        body = json.dumps(obj, separators=(",", ":"), default=_json_default).encode()
        resp = self.s3.put_object(
            Bucket=self.bucket, Key=key, Body=body, ContentType="application/json", **kwargs
        )
        return resp["ETag"]

    def put_bytes(self, key: str, body: bytes, *, content_type: str | None = None) -> None:
        kwargs = {"ContentType": content_type} if content_type else {}
        self.s3.put_object(Bucket=self.bucket, Key=key, Body=body, **kwargs)

    def get_bytes(self, key: str) -> bytes:
        """The object's bytes. Raises KeyError(key) when absent."""
        try:
            return self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                raise KeyError(key) from None
            raise

    def exists(self, key: str) -> bool:
        try:
            self.s3.head_object(Bucket=self.bucket, Key=key)
            return True
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise

    def delete(self, key: str) -> None:
        """DeleteObject of ``key`` (no error when it is absent)."""
        self.s3.delete_object(Bucket=self.bucket, Key=key)

    def list_keys(self, prefix: str) -> list[str]:
        """Every key under ``prefix``, sorted."""
        keys: list[str] = []
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            keys.extend(o["Key"] for o in page.get("Contents", []))
        return sorted(keys)

    # -- a generation batch's rollout records

    def batch_rollouts(self, run_id: str, step: int, generation_batch: int, kind: str = "train", *,
                       group: int | None = None, attempt: int = 0) -> list[RolloutRecord]:
        """The current rollout record of each item of a generation batch (with ``group``, of that group's attempt:
        admission 'group' keeps a group's rollouts in its own folder), in item order: when an item has
        several (a resumed run re-doing a step after a rewind, a re-run Map child), the one whose sid its start
        marker names (the newest start). Items without a record are absent. One LIST, then the GETs in
        parallel (`get_json_many`: a GET from a Lambda takes tens of ms, one at a time 1,024 records hold the
        training session idle for tens of seconds), each record parsed as it arrives."""
        prefix = rollouts_prefix(run_id, step, generation_batch, kind, group=group, attempt=attempt)
        keys = [k for k in self.list_keys(prefix) if k.endswith(".json")]
        by_i: dict[int, list[RolloutRecord]] = {}
        for r in self.get_json_many(keys, RolloutRecord.model_validate):
            by_i.setdefault(r.i, []).append(r)
        out = []
        for i, records in sorted(by_i.items()):
            if len(records) > 1:
                sid = (self.get_json_or(start_marker_key(run_id, step, generation_batch, kind, i, group=group,
                                                         attempt=attempt)) or {}).get("sid")
                records = [r for r in records if r.sid == sid] or records[-1:]
            out.append(records[0])
        return out

    def list_run_ids(self) -> list[str]:
        """The run ids with a folder under ``runs/`` (ListObjectsV2 with delimiter ``/``: one key per
        run, not every object), sorted."""
        ids: list[str] = []
        paginator = self.s3.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=RUNS_PREFIX, Delimiter="/"):
            ids.extend(p["Prefix"][len(RUNS_PREFIX):].rstrip("/") for p in page.get("CommonPrefixes", []))
        return sorted(i for i in ids if i)

    # -- run state

    def create_state(self, state: RunState) -> str:
        """First write of state.json; raises RunOwnedElsewhere if the run already exists. The
        invocation's measurements so far ride in it (`stepwise.metering`: the cost ledger)."""
        ride = metering.ride(state.run_id)
        first = state.model_copy(deep=True)
        first.ledger.usage.add(ride.usage)
        try:
            etag = self.put_json(state_key(state.run_id), first.model_dump(), if_none_match=True)
            ride.commit()
            return etag
        except ClientError as e:
            ride.cancel()
            if _precondition_failed(e):
                existing = self.read_state(state.run_id)[0]
                raise RunOwnedElsewhere(
                    f"run {state.run_id!r} already exists (owned by {existing.owner_execution_arn}); "
                    "start the execution under a new name, or continue it from its owner"
                ) from None
            raise

    def read_state(self, run_id: str) -> tuple[RunState, str]:
        """``(state, etag)``. Raises RunNotFound."""
        state, etag, _ = self.read_state_at(run_id)
        return state, etag

    def read_state_at(self, run_id: str) -> tuple[RunState, str, float]:
        """``(state, etag, last change)``: the last change is state.json's LastModified (epoch seconds),
        what the session sweeper waits out (`stepwise.core.sweeping.sweep_verdict`). Raises RunNotFound."""
        try:
            obj, etag, modified = self.get_json_meta(state_key(run_id))
        except KeyError:
            raise RunNotFound(f"run {run_id!r} has no state at s3://{self.bucket}/{state_key(run_id)}") from None
        return RunState.model_validate(obj), etag, modified

    def update_state(
        self,
        run_id: str,
        change: Callable[[RunState], None],
        *,
        execution_arn: str | None,
        attempts: int = 8,
        first_read: tuple[RunState, str] | None = None,
    ) -> RunState:
        """Read-modify-write state.json, conditional on the ETag read (S3 ``IfMatch``).

        ``change`` mutates the state in place; it is re-applied to a fresh read when another
        writer got in between, so it must be a pure function of the state it is given.
        ``first_read`` is a `read_state` the caller already made, ``(state, etag)``: the first attempt
        changes it instead of reading again (one GET less; a stale one only costs a retry, the write
        being conditional on its ETag). It is changed in place.

        Every write carries this container's measurements of the run into ``state.ledger`` (added
        before ``change`` sees the state; `stepwise.metering`: the cost ledger).

        Raises:
            RunOwnedElsewhere: ``execution_arn`` is given and is not the state's owner.
            StateConflict: still conflicting after ``attempts`` reads.
        """
        ride = metering.ride(run_id)
        try:
            for attempt in range(attempts):
                state, etag = first_read if (attempt == 0 and first_read is not None) else self.read_state(run_id)
                check_owner(state, execution_arn)
                state.ledger.usage.add(ride.usage)
                change(state)
                try:
                    self.put_json(state_key(run_id), state.model_dump(), if_match=etag)
                    ride.commit()
                    return state
                except ClientError as e:
                    if not _precondition_failed(e):
                        raise
        finally:
            ride.cancel()  # no-op once committed
        raise StateConflict(f"state.json of run {run_id!r} kept changing under us ({attempts} attempts)")

    def owned_state(self, run_id: str, execution_arn: str | None) -> RunState:
        """Read the state and check that ``execution_arn`` owns it."""
        state, _ = self.read_state(run_id)
        check_owner(state, execution_arn)
        return state


    # -- the group engine's buffer (admission: group)

    def read_buffer(self, run_id: str) -> tuple[GroupBuffer, str]:
        """``(buffer, etag)`` of ``runs/{run_id}/buffer.json``. Raises KeyError when the run has none."""
        obj, etag = self.get_json_etag(buffer_key(run_id))
        return GroupBuffer.model_validate(obj), etag

    def create_buffer(self, buffer: GroupBuffer) -> bool:
        """First write of the buffer; False (nothing written) when the run has one already (a retried Init)."""
        try:
            self.put_json(buffer_key(buffer.run_id), buffer.model_dump(), if_none_match=True)
            return True
        except ClientError as e:
            if _precondition_failed(e):
                return False
            raise

    def update_buffer(self, run_id: str, change: Callable[[GroupBuffer], T], *, attempts: int = 24
                      ) -> tuple[GroupBuffer, T]:
        """Read-modify-write ``buffer.json``, conditional on the ETag read; ``change`` mutates the buffer
        and returns what the caller wants back (it is re-applied to a fresh read after a conflict, so it
        must be a pure function of the buffer it is given). Groups completing together conflict: each
        retry waits a random moment first (full jitter, up to 2 s).

        Raises:
            KeyError: the run has no buffer.
            StateConflict: still conflicting after ``attempts`` reads.
        """
        for attempt in range(attempts):
            buffer, etag = self.read_buffer(run_id)
            out = change(buffer)
            try:
                self.put_json(buffer_key(run_id), buffer.model_dump(), if_match=etag)
                return buffer, out
            except ClientError as e:
                if not _precondition_failed(e):
                    raise
            time.sleep(random.uniform(0, min(2.0, 0.02 * 2 ** attempt)))
        raise StateConflict(f"buffer.json of run {run_id!r} kept changing under us ({attempts} attempts)")


def check_owner(state: RunState, execution_arn: str | None) -> None:
    """Raise RunOwnedElsewhere unless ``execution_arn`` is None or the run's owner."""
    if execution_arn is not None and state.owner_execution_arn != execution_arn:
        raise RunOwnedElsewhere(
            f"run {state.run_id!r} is owned by execution {state.owner_execution_arn}, not {execution_arn}; "
            "two executions must not drive one run"
        )


def _precondition_failed(e: ClientError) -> bool:
    err = e.response.get("Error", {})
    return err.get("Code") in ("PreconditionFailed", "412", "ConditionalRequestConflict") or (
        e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 412
    )


def _json_default(o: Any) -> Any:
    if isinstance(o, BaseModel):
        return o.model_dump()
    if hasattr(o, "tolist"):
        return o.tolist()
    if hasattr(o, "__dict__"):
        return vars(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")
