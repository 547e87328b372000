"""AdmitGroups and AwaitGroups: the training loop's side of the group engine (``admission: group``).

- AdmitGroups ("Admit groups", and "Admit groups while this step trains" after ComputeAdvantages took a
  batch out of the buffer): start the groups `stepwise.core.groups.admit` allows, one rollout-group
  execution each (`stepwise.handlers._groups.admit_groups`).
- AwaitGroups ("Wait for a batch of groups", ``lambda:invoke.waitForTaskToken``): store the trainer's task
  token and the version it waits at in the buffer; when a batch is already ready send SendTaskSuccess
  itself, else the group completion that makes one ready does (RecordGroupComplete). The task's timeout
  brings it back here, which also records the groups whose execution ended unrecorded
  (`stepwise.handlers._groups.reconcile`): no polling loop in between.

The group executions' own last state, RecordGroupComplete, lives with ComputeAdvantages
(`stepwise.handlers.advantages`), which reads rollout records the same way.
"""

from __future__ import annotations

from typing import Any

from stepwise.core import groups as engine
from stepwise.events import AdmitEvent, AwaitEvent
from stepwise.handlers import _groups
from stepwise.handlers._common import entrypoint, logger, now, store


def admit(event: AdmitEvent) -> dict[str, Any]:
    """Start the groups that fit; returns ``{admitted, groups, in_flight_rollouts, buffer_depth}``."""
    run = event.run
    state, cfg = _groups.owned_run(run)
    buffer, admitted = _groups.admit_groups(run, cfg, event.group_state_machine_arn, state=state)
    out = {"admitted": len(admitted), "groups": [g.id for g in admitted][:20],
           "in_flight_rollouts": engine.in_flight_rollouts(buffer), "buffer_depth": len(engine.untrained(buffer))}
    if not admitted:
        out["why"] = engine.admission_blocker(buffer, _groups.knobs(cfg), sampler_version=state.policy_version,
                                              base_sampler=not state.sampler_model_package_arn) or "admitted nothing"
    logger.info("groups admitted", extra=out)
    return out


def await_batch(event: AwaitEvent) -> dict[str, Any]:
    """Register the trainer's wait; wake it now when a batch is ready (see the module doc)."""
    run = event.run
    state, cfg = _groups.owned_run(run)
    kn, t = _groups.knobs(cfg), now()
    buffer, token = store().update_buffer(run.run_id, lambda b: engine.await_trainer(
        b, kn, token=event.task_token, version=state.policy_version, now=t))
    ready = engine.readiness(buffer, kn, version=state.policy_version)
    if token is not None:
        _groups.wake(token, f"ready when the trainer came ({ready.status})")
    else:
        _groups.reconcile(run, cfg, buffer)
    out = {"status": ready.status, "reason": ready.reason, "woken": token is not None}
    logger.info("waiting for a batch of groups" if token is None else "a batch of groups is ready", extra=out)
    return out


admit_handler = entrypoint(AdmitEvent, admit, transient_retry=True)
await_handler = entrypoint(AwaitEvent, await_batch, transient_retry=True)
