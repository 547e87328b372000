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
from stepwise.handlers._common import bind, entrypoint, logger, now, run_config, store
from stepwise.records import GroupBuffer


def admit(event: AdmitEvent) -> dict[str, Any]:
    """Start the groups that fit; returns ``{admitted, groups, in_flight_rollouts, buffer_depth}``."""
    rs = store()
    run = event.run
    state = rs.owned_state(run.run_id, run.execution_arn)
    bind(run_id=run.run_id, step=state.step)
    cfg = run_config(run.run_id)
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
    rs = store()
    run = event.run
    state = rs.owned_state(run.run_id, run.execution_arn)
    bind(run_id=run.run_id, step=state.step)
    cfg = run_config(run.run_id)
    kn, t = _groups.knobs(cfg), now()

    def change(b: GroupBuffer) -> str | None:
        b.trainer_token = event.task_token
        if b.waiting_version != state.policy_version or b.waiting_since is None:
            b.waiting_since, b.data_ready_at = t, None
        b.waiting_version = state.policy_version
        return _groups.note_ready(b, kn, t)

    buffer, token = rs.update_buffer(run.run_id, change)
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
