"""What the run-end drills (tests/drills/test_run_end_at_scale.py) and their benchmark
(benchmarks/run_end_at_scale.py) share: a handler run as Lambda runs it, a long run's end with its
model packages, and a batch of rollouts in flight on the slow agent behind the ACR emulator."""

from __future__ import annotations

import contextlib
import importlib
import json
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Iterator
from typing import Any

from local.engine import LambdaContext, run_handler
from stepwise.aws.runstore import RunStore
from stepwise.concurrency import RateLimiter
from stepwise.functions import by_name
from stepwise.records import Checkpoint, EvalPoint
from tests.support.pipeline import BUCKET, REGION, Stack, execution_arn, init_run, new_run_id, run_ref, wait_ready

SLOW_AGENT = f"arn:aws:bedrock-agentcore:{REGION}:123456789012:runtime/slow_agent-local"


def invoke(function: str, event: dict[str, Any], *, timeout_s: int | None = None) -> tuple[dict[str, Any], float]:
    """Run the stack's ``function`` on ``event`` as Lambda would (its entrypoint, its memory, its timeout or
    ``timeout_s``: `local.engine.run_handler`); returns (its answer, seconds). Raises AssertionError with
    Lambda's error when it fails (a timeout or memory past the limit included)."""
    spec = by_name(function)
    module, _, attr = spec.handler.rpartition(".")
    handler = getattr(importlib.import_module(module), attr)
    ctx = LambdaContext(spec.name, spec.memory_mb, f"arn:aws:lambda:{REGION}:123456789012:function:{spec.name}",
                        timeout_s or spec.timeout_s)
    started = time.monotonic()
    payload, error, peak = run_handler(spec.name, handler, event, ctx)
    seconds = time.monotonic() - started
    answer = json.loads(payload or b"{}")
    assert error is None, f"{function} failed after {seconds:.1f} s (peak {peak:.0f} MB): {str(answer)[:2000]}"
    return answer, seconds


def stop_event(run_id: str, reason: str = "finished") -> dict[str, Any]:
    """StopSession's input from the state machine's stop state."""
    return {"execution_arn": execution_arn(run_id), "execution_name": run_id, "input": {}, "reason": reason}


def aborted_event(run_id: str) -> dict[str, Any]:
    """Cleanup's input: EventBridge's status change of the run's execution, ABORTED."""
    return {"source": "aws.states", "detail-type": "Step Functions Execution Status Change",
            "detail": {"status": "ABORTED", "executionArn": execution_arn(run_id), "name": run_id, "input": "{}"}}


def long_run(stack: Stack, packages: int) -> tuple[str, list[str], set[str]]:
    """A run whose state is a long run's end with ``keep_model_packages: best_and_last``: ``packages``
    model packages created (each step's sampler weights, a save_every checkpoint every 100), evals with a
    best a quarter of the way in, a final checkpoint. Returns (run id, every package, the ones kept)."""
    run_id = new_run_id("retention")
    init_run(stack, run_id, stack.config(keep_model_packages="best_and_last"))
    assert wait_ready(run_id)["ready"]
    rs = RunStore(BUCKET, stack.s3)
    session = rs.read_state(run_id)[0].training_session_name
    arns = stack.sim.seed_model_packages(session, packages)
    best, final_state, final = arns[packages // 4], arns[-2], arns[-1]

    def the_end(s) -> None:
        s.created_packages = list(arns)
        s.checkpoints = [Checkpoint(step=i, kind="state", model_package_arn=arns[i], reason="save_every")
                         for i in range(99, packages - 2, 100)]
        s.checkpoints.append(Checkpoint(step=packages - 2, kind="state", model_package_arn=final_state, reason="final"))
        s.step = s.policy_version = packages - 2
        s.sampler_model_package_arn = final
        s.eval_history = [EvalPoint(step=0, value=0.1), EvalPoint(step=packages // 4, value=0.9, model_package_arn=best),
                          EvalPoint(step=packages // 2, value=0.4, model_package_arn=arns[packages // 2])]
        s.best = s.eval_history[1]

    rs.update_state(run_id, the_end, execution_arn=None)
    return run_id, arns, {best, final_state, final}


@contextlib.contextmanager
def acr_at(stack: Stack, tps: int, quota: int) -> Iterator[Any]:
    """An ACR emulator at ``tps`` requests a second and ``quota`` active sessions, the handlers pointed at
    it for the block (then back at the stack's own)."""
    from local.acr import AcrEmulator, SessionLifecycle

    emulator = AcrEmulator(region=REGION, tps_limit=tps, lifecycle=SessionLifecycle(session_quota=quota)).start()
    stack.mp.setenv("AWS_ENDPOINT_URL_BEDROCK_AGENTCORE", emulator.url)
    stack.mp.setenv("AWS_ENDPOINT_URL_BEDROCK_AGENTCORE_CONTROL", emulator.url)
    try:
        yield emulator
    finally:
        emulator.stop()
        stack.mp.setenv("AWS_ENDPOINT_URL_BEDROCK_AGENTCORE", stack.agent.url)
        stack.mp.setenv("AWS_ENDPOINT_URL_BEDROCK_AGENTCORE_CONTROL", stack.acr.url)


def in_flight_run(stack: Stack, rollouts: int, tps: int, **config: Any) -> tuple[str, dict[str, Any], list[str], float]:
    """A run with ``rollouts`` rollouts in flight on the slow agent (one batch of ``rollouts // 2``
    prompts x 2, each started by StartRollout at ``tps`` a second, ``acr_tps_limit``; a throttled invoke
    retried after a second, as the ASL's Retry does). Returns (run id, its config, the sids, seconds the
    starts took)."""
    from stepwise.events import RunEvent, StartEvent
    from stepwise.handlers.plan import plan
    from stepwise.handlers.rollout import start

    prompts = rollouts // 2
    rows = [{"prompt": f"What digit comes after {i % 9}?", "answer": str(i % 9 + 1), "seconds": 3600} for i in range(prompts)]
    dataset = stack.put_dataset(f"data/in-flight-{prompts}.jsonl", rows)
    cfg = stack.config(dataset_path=dataset, agent_runtime_arn=SLOW_AGENT, batch_size=prompts, responses_per_prompt=2,
                       acr_tps_limit=tps, max_rollout_time=3600, **config)
    run_id = new_run_id("in-flight")
    init_run(stack, run_id, cfg)
    assert wait_ready(run_id)["ready"]
    p = plan(RunEvent.model_validate({"run": run_ref(run_id)}))
    items = json.loads(stack.s3.get_object(Bucket=BUCKET, Key=p["items_key"])["Body"].read())
    assert len(items) == rollouts

    pace = RateLimiter(tps)  # the Map starts children at the rate the config declares

    def one(item: dict[str, Any]) -> str:
        for _ in range(60):
            pace.acquire()
            try:
                return start(StartEvent.model_validate({"task_token": f"token-{item['i']}", "run": run_ref(run_id),
                                                        "batch": p["batch"], "item": item}))["sid"]
            except Exception as e:  # noqa: BLE001 - AgentRuntimeThrottled: the Map's Retry
                if "Throttl" not in type(e).__name__:
                    raise
                time.sleep(1.0)
        raise AssertionError(f"item {item['i']} never started")

    t0 = time.monotonic()
    with ThreadPoolExecutor(32) as pool:
        sids = list(pool.map(one, items))
    return run_id, cfg, sids, time.monotonic() - t0
