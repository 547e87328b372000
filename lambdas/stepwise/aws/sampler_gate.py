"""The run's current sampler and its turn gate in S3 (the rules: `stepwise.core.sampler_binding`).

Objects (`stepwise.layout`): ``runs/{run_id}/sampler/current.json`` (`stepwise.records.RunSampler`,
written by Rebind around each load) and ``runs/{run_id}/sampler/leases/{deadline}-{id}.json`` (one per
turn sampling under a ``turn_gate``, written and deleted by the gateway, listed by Rebind). A lease's
deadline is in its key, so Rebind's look at the gate is one ``ListObjectsV2`` whatever the number of
rollouts; leases are tagged bulk (the stack's lifecycle rule expires what a crashed gateway left).

Requests: the gateway's ``turn_gate`` turn is one PUT (its lease), one GET (the gate) and one DELETE
(the lease), plus a PUT and a DELETE per `LEASE_RENEW_SECONDS` the turn runs and a GET per
`HOLD_POLL_SECONDS` it is held; a ``next_turn`` turn at most one GET (a container keeps the sampler it
read for `CURRENT_SAMPLER_MAX_AGE_SECONDS`). Rebind: a GET, a PUT and a LIST per call while the gate
is closed, and a PUT when it opens.
"""

from __future__ import annotations

import json
from typing import Any

from botocore.exceptions import ClientError

from stepwise.aws.runstore import RunStore
from stepwise.layout import BULK_TAGGING, current_sampler_key, lease_deadline, lease_key, leases_prefix
from stepwise.records import RunSampler


def read_current(rs: RunStore, run_id: str) -> RunSampler | None:
    """The run's current sampler, or None before Rebind first wrote it."""
    raw = rs.get_json_or(current_sampler_key(run_id))
    return None if raw is None else RunSampler.model_validate(raw)


def write_current(rs: RunStore, run_id: str, sampler: RunSampler) -> None:
    rs.put_json(current_sampler_key(run_id), sampler.model_dump(mode="json"))


def put_lease(rs: RunStore, run_id: str, deadline: float, lease_id: str, holder: str = "") -> str:
    """Write a turn's lease (deadline: epoch seconds; ``holder``: a digest naming the session, for a
    person reading the bucket); returns its key."""
    key = lease_key(run_id, deadline, lease_id)
    body = json.dumps({"deadline": deadline, "holder": holder}).encode()
    rs.s3.put_object(Bucket=rs.bucket, Key=key, Body=body, ContentType="application/json", Tagging=BULK_TAGGING)
    return key


def drop_lease(rs: RunStore, key: str) -> None:
    """Delete a lease (deleting one already gone is not an error in S3)."""
    try:
        rs.s3.delete_object(Bucket=rs.bucket, Key=key)
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") not in ("NoSuchKey", "404"):
            raise


def lease_deadlines(rs: RunStore, run_id: str) -> list[float]:
    """The deadlines of every lease of the run (one listing; keys that are not leases are ignored)."""
    out: list[float] = []
    for key in rs.list_keys(leases_prefix(run_id)):
        deadline = lease_deadline(key)
        if deadline is not None:
            out.append(deadline)
    return out


def store_over(s3: Any, bucket: str) -> RunStore:
    """A `RunStore` over an existing S3 client (the gateway's)."""
    return RunStore(bucket, s3=s3)
