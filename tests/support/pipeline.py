"""Shared parts of the pipeline tests (tests/handlers/, tests/drills/, tests/infra/):
moto (S3 + Step Functions) on loopback, the SageMaker simulator, a valid run config, and
helpers that play the agent + gateway side of a rollout (captured turns and a result object)."""

from __future__ import annotations

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3
import pytest
from stepwise.layout import session_key, turns_prefix

REPO = Path(__file__).resolve().parents[2]
TINY_MODEL = REPO / "local" / "assets" / "tiny-model"
BUCKET = "stepwise-pipeline-test"
REGION = "us-east-1"  # the local engine's region: Lambdas talk to the state machine's region
AGENT_ARN = "arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/toy_agent-abc"  # the stack's region


class Stack:
    """moto server + simulator, with the environment every handler reads; ``deploy`` adds the
    functions and the state machine for tests of whole executions. ``simulator_options`` go to
    ``start_simulator``."""

    def __init__(self, bucket: str = BUCKET, **simulator_options: Any) -> None:
        from local import engine
        from local.simulator import start_simulator

        from tests.support import billing

        billing.STACKS.add(self)
        # The project's moto seam: S3, Step Functions (executing) and Lambda dispatched in-process.
        self.moto = engine.MotoServer().start()
        self.mp = pytest.MonkeyPatch()
        self.endpoint = self.moto.endpoint
        self.bucket = bucket
        self.sim = start_simulator(**simulator_options)
        # ACR's control plane (GetAgentRuntime, Init's runtime check); FakeAgent plays the data plane.
        from local.acr import AcrEmulator

        self.acr = AcrEmulator(region=REGION).start()
        # ACR's data plane (InvokeAgentRuntime, StopRuntimeSession) until `deploy` names another agent.
        self.agent = self._default_agent = FakeAgent()
        env = dict(self.sim.env)
        env["AWS_ENDPOINT_URL_BEDROCK_AGENTCORE_CONTROL"] = self.acr.url
        env["AWS_ENDPOINT_URL_BEDROCK_AGENTCORE"] = self.agent.url
        env.update({
            "AWS_DEFAULT_REGION": REGION,
            "AWS_REGION": REGION,
            "STEPWISE_BUCKET": bucket,
            "STEPWISE_GATEWAY_URL": "http://127.0.0.1:9/gateway",
            "STEPWISE_POLL_SECONDS": "1",
            "STEPWISE_INLINE_WAIT_SECONDS": "10",
            "STEPWISE_TURN_GRACE_SECONDS": "0.05",
            "POWERTOOLS_METRICS_NAMESPACE": "StepwiseTest",
        })
        for k, v in env.items():
            self.mp.setenv(k, v)
        self.s3 = boto3.client("s3", region_name=REGION)
        try:  # moto's backends are process-wide: an earlier module may have made it
            self.s3.create_bucket(Bucket=bucket)
        except self.s3.exceptions.BucketAlreadyOwnedByYou:
            pass
        # The handlers' dependencies follow the environment just set (a new moto endpoint: new clients).

    def deploy(self, agent: FakeAgent, prefix: str, name: str | None = None, *,
               track: bool = False) -> tuple[dict[str, str], str]:
        """Deploy as `stepwise run-local` does: the stack's functions (local names from ``prefix``),
        the bucket's ObjectCreated notification on ``rollout-results/`` -> OnRolloutResult (and, with
        ``track``, summaries -> Track: most drills leave the report page out), and the state machine
        ``name`` (default ``prefix``) with the real ASL; ``agent`` plays ACR.
        Returns (function ARNs by spec name, state machine ARN)."""
        from local import resources
        from local.stack import create_state_machines

        self.mp.setenv("AWS_ENDPOINT_URL_BEDROCK_AGENTCORE", agent.url)
        self.agent = agent
        arns = resources.create_functions(self.moto, prefix=prefix)
        resources.create_bucket(self.moto, self.bucket, result_function_arn=arns["OnRolloutResult"],
                                track_function_arn=arns["Track"] if track else None)
        sm_arn, _, self.group_state_machine_arn = create_state_machines(self.moto, arns, self.bucket, name or prefix)
        return arns, sm_arn

    def stop(self) -> None:
        from tests.support import billing

        billing.STACKS.discard(self)
        self.acr.stop()
        self._default_agent.stop()
        self.sim.stop()
        self.mp.undo()
        self.moto.stop()

    # ------------------------------------------------------------------ data and config

    def put_dataset(self, key: str, payloads: list[dict[str, Any]]) -> str:
        body = "\n".join(json.dumps({"payload": p}) for p in payloads) + "\n"
        self.s3.put_object(Bucket=self.bucket, Key=key, Body=body.encode())
        return f"s3://{self.bucket}/{key}"

    def config(self, **overrides: Any) -> dict[str, Any]:
        """A valid run config on this stack (the toy payloads as the dataset unless
        ``dataset_path`` is given), updated with ``overrides``."""
        from prepare_datasets import prepare_toy

        cfg = {
            "region": REGION,
            "role_arn": self.sim.role_arn,
            "base_model_arn": "stepwise-tiny",
            "model_package_group_arn": self.sim.model_package_group_arn,
            "s3_output_path": f"s3://{self.bucket}/checkpoints/",  # the stack bucket: in its grants
            "agent_runtime_arn": AGENT_ARN,
            "dataset_path": overrides.get("dataset_path") or self.put_dataset("data/toy.jsonl", prepare_toy.all_payloads()),
            "tokenizer_path": str(TINY_MODEL),
            "batch_size": 2,
            "responses_per_prompt": 2,
            "max_new_tokens": 512,
            "learning_rate": 1e-3,
            "loss": "importance_sampling",
            "max_rollout_time": 30,
        }
        cfg.update(overrides)
        return cfg


def session_creates(stack: Stack) -> int:
    """How many CreateTrainingSession calls ``stack``'s simulator has answered (refusals before billing make none)."""
    return stack.sim.counters.get("CreateTrainingSession", 0)


def execution_arn(run_id: str) -> str:
    return f"arn:aws:states:{REGION}:123456789012:execution:stepwise-training:{run_id}"


def new_run_id(prefix: str = "run") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def run_ref(run_id: str) -> dict[str, str]:
    return {"run_id": run_id, "execution_arn": execution_arn(run_id)}


def init_run(stack: Stack, run_id: str, config: dict[str, Any]) -> dict[str, Any]:
    from stepwise.events import InitEvent
    from stepwise.handlers.init import initialize

    return initialize(InitEvent(input=config, execution_arn=execution_arn(run_id), execution_name=run_id))


def wait_ready(run_id: str, timeout: float = 30.0) -> dict[str, Any]:
    from stepwise.events import RunEvent
    from stepwise.handlers.session import poll_session

    deadline = time.monotonic() + timeout
    while True:
        out = poll_session(RunEvent.model_validate({"run": run_ref(run_id)}))
        if out["ready"] or time.monotonic() > deadline:
            return out
        time.sleep(0.2)


def captured_turn(sid: str, prompt_ids: list[int], output_ids: list[int], logprobs: list[float]) -> dict[str, Any]:
    """A turn body as the gateway persists it (docs/internals.md, "Captured turn")."""
    return {
        "sid": sid,
        "turn": {"prompt_ids": prompt_ids, "output_ids": output_ids, "finish_reason": "stop",
                 "output_log_probs": logprobs, "ill_formed": False},
        "prompt_messages": [{"role": "user", "content": "q"}],
        "response_message": {"role": "assistant", "content": "a"},
        "metadata": {},
    }


def play_rollout(stack: Stack, run_id: str, sid: str, input_id: str, reward: float | None,
                 output_ids: list[int], prompt_ids: list[int] | None = None, with_turn: bool = True) -> str:
    """What the gateway and the agent leave in S3 for one rollout: one captured turn (none when
    ``with_turn`` is false: an agent that never called its LLM), then the toolkit's result object
    (``reward=None`` writes none). Returns the result key."""
    from stepwise.layout import result_key, turns_prefix

    prompt_ids = prompt_ids or [1, 2, 3, 4]
    turn = captured_turn(sid, prompt_ids, output_ids, [-0.5] * len(output_ids))
    if with_turn:
        stack.s3.put_object(Bucket=stack.bucket, Key=f"{turns_prefix(run_id, sid)}{time.time_ns():020d}-{uuid.uuid4().hex}.json",
                            Body=json.dumps(turn).encode())
    key = result_key(run_id, input_id, sid)
    if reward is not None:
        stack.s3.put_object(Bucket=stack.bucket, Key=key,
                            Body=json.dumps({"rewards": reward, "status_code": 200, "input_id": input_id}).encode())
    return key


def roll_out_batch(stack: Stack, run_id: str, plan: dict[str, Any], rewards: list[float],
                   output_ids: list[list[int]] | None = None, with_turns: list[bool] | None = None) -> list[dict[str, Any]]:
    """Run FinishRollout for every item of a planned batch, as if each agent finished with ``rewards[i]``
    (item ``i`` without a captured turn when ``with_turns[i]`` is false)."""
    from stepwise.events import FinishEvent
    from stepwise.handlers.rollout import finish

    items = json.loads(stack.s3.get_object(Bucket=stack.bucket, Key=plan["items_key"])["Body"].read())
    outs = []
    for item in items:
        sid = str(uuid.uuid4())
        ids = (output_ids or [[10 + item["i"], 11, 12]] * len(items))[item["i"]]
        key = play_rollout(stack, run_id, sid, item["input_id"], rewards[item["i"]], ids,
                           with_turn=True if with_turns is None else with_turns[item["i"]])
        outs.append(finish(FinishEvent.model_validate({
            "run": run_ref(run_id), "batch": plan["batch"], "item": item,
            "result": {"sid": sid, "result_key": key}, "error": None})))
    return outs


class FakeAgent:
    """InvokeAgentRuntime and StopRuntimeSession on loopback: an invoke answers "processing", then
    writes a turn and a result; a stop ends the session (ResourceNotFoundException when it is not
    active, as ACR answers).

    The first rollout of each prompt (``input_id``) of a run to finish gets reward 1.0, the others 0.0,
    so every group has signal. ``sessions``: sid -> run id of every session invoked and not stopped
    (what `tests.support.billing` checks after an end-to-end test); ``stopped``: the stopped sids.
    """

    def __init__(self) -> None:
        agent = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def _answer(self, status: int, body: dict, error_type: str | None = None) -> None:
                out = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                if error_type:
                    self.send_header("X-Amzn-ErrorType", error_type)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                sid = self.headers["X-Amzn-Bedrock-AgentCore-Runtime-Session-Id"]
                if self.path.split("?", 1)[0].endswith("/stopruntimesession"):
                    with agent._lock:
                        agent.stop_calls.append(sid)
                        active = agent.sessions.pop(sid, None) is not None
                        if active:
                            agent.stopped.append(sid)
                    if not active:
                        return self._answer(404, {"message": f"session {sid} not found or already terminated"},
                                            "ResourceNotFoundException")
                    return self._answer(200, {"runtimeSessionId": sid})
                body = json.loads(raw)
                with agent._lock:
                    agent.received.append(sid)
                if agent.throttle > 0:  # like ACR above its rate: 429 ThrottlingException
                    agent.throttle -= 1
                    return self._answer(429, {"message": "Rate exceeded"}, "ThrottlingException")
                if agent.fail > 0:  # ACR failing after it took the request: 500 InternalServerException
                    agent.fail -= 1
                    with agent._lock:
                        agent.sessions[sid] = body["_rollout"]["exp_id"].split("/", 1)[1]
                    return self._answer(500, {"message": "internal error"}, "InternalServerException")
                agent.visible_at_invoke[sid] = agent.visible(body, sid)
                agent.invocations.append(body)
                with agent._lock:
                    agent.sessions[sid] = body["_rollout"]["exp_id"].split("/", 1)[1]
                self._answer(200, {"status": "processing"})
                threading.Thread(target=agent.finish, args=(body, sid), daemon=True).start()

        self.invocations: list[dict] = []
        self.received: list[str] = []  # the sid of every InvokeAgentRuntime request, refused ones too
        self.stop_calls: list[str] = []  # the sid of every StopRuntimeSession request
        self.throttle = 0
        self.fail = 0  # the next N invokes start their session, then answer 500
        self.write_results = True
        # seconds each rollout takes before its result is written (its ACR session); or a function of the
        # invocation's body (e.g. a heavy tail by prompt)
        self.result_delay: float | Any = 0.0
        self.visible_at_invoke: dict[str, dict[str, bool]] = {}
        # replaces the reward (called with the invocation's body and the default reward) when set
        self.reward_fn: Any = None
        self.sessions: dict[str, str] = {}
        self.stopped: list[str] = []
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def active_sessions(self, run_id: str | None = None) -> list[str]:
        """The sids invoked and not stopped (of ``run_id`` only, when given)."""
        with self._lock:
            return [sid for sid, rid in self.sessions.items() if run_id is None or rid == run_id]

    @staticmethod
    def visible(body: dict, sid: str) -> dict[str, bool]:
        """Which of the rollout's objects exist when the agent is invoked."""
        ro = body["_rollout"]
        run_id = ro["exp_id"].split("/", 1)[1]
        s3 = boto3.client("s3")
        try:
            record = json.loads(s3.get_object(Bucket=ro["s3_bucket"], Key=session_key(sid))["Body"].read())
        except Exception:
            return {"session": False, "task_token": False}
        return {"session": record.get("run_id") == run_id, "task_token": bool(record.get("task_token"))}

    def finish(self, body: dict, sid: str) -> None:
        if not self.write_results:
            return
        delay = self.result_delay(body) if callable(self.result_delay) else self.result_delay
        if delay:
            time.sleep(delay)
        ro = body["_rollout"]
        run_id = ro["exp_id"].split("/", 1)[1]
        s3 = boto3.client("s3")
        turn = captured_turn(sid, [1, 2, 3], [20, 21, 22], [-0.3, -0.2, -0.1])
        try:  # the policy version the gateway would have sampled the turn with (its session record's)
            record = json.loads(s3.get_object(Bucket=ro["s3_bucket"], Key=session_key(sid))["Body"].read())
            turn["policy_version"] = record["policy_version"]
        except Exception:
            pass
        s3.put_object(Bucket=ro["s3_bucket"], Key=turns_prefix(run_id, sid) + f"{time.time_ns():020d}-{uuid.uuid4().hex}.json",
                      Body=json.dumps(turn).encode())
        with self._lock:  # per run (exp_id): runs of one stack reuse input ids
            reward = 0.0 if (ro["exp_id"], ro["input_id"]) in self._seen else 1.0
            self._seen.add((ro["exp_id"], ro["input_id"]))
        if self.reward_fn is not None:
            reward = self.reward_fn(body, reward)
        s3.put_object(Bucket=ro["s3_bucket"], Key=f"{ro['exp_id']}/{ro['input_id']}/{sid}.json",
                      Body=json.dumps({"rewards": reward, "status_code": 200}).encode())

    def stop(self) -> None:
        self.server.shutdown()


def wait_execution(sfn: Any, arn: str, timeout: float = 240) -> dict[str, Any]:
    """DescribeExecution once the execution is no longer RUNNING; AssertionError after ``timeout`` s.
    The run of an execution that ended is checked for anything left billing at the test's end
    (`tests.support.billing`)."""
    from tests.support import billing

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        d = sfn.describe_execution(executionArn=arn)
        if d["status"] != "RUNNING":
            billing.execution_ended(sfn, d)
            return d
        time.sleep(0.3)
    raise AssertionError(f"{arn} still running after {timeout}s")
