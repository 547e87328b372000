"""The ACR emulator in front of the real example agents (AgentCoreRLApp in their own processes).

boto3's ``bedrock-agentcore`` client talks to the emulator; the agents write their results
to moto S3; their LLM is a scripted OpenAI-compatible endpoint (the LLM is not under test
here: the emulator, the toolkit's container contract and the agents' logic are).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from local import engine, resources
from local.acr import AcrEmulator, SessionLifecycle, agent_spec_for_arn
from local.agents.math_agent import calculate, strict_reward

BUCKET = "stepwise-acr-test"
TOY_ARN = "arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/toy_agent-local"
MATH_ARN = "arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/math_agent-local"


class ScriptedLLM:
    """An OpenAI chat-completions endpoint whose replies a test scripts per api key."""

    def __init__(self):
        self.requests: list[dict] = []
        self.replies: dict[str, list[dict]] = {}
        self.hold: dict[str, threading.Event] = {}  # api key -> the reply waits for this event (a hung LLM call)
        llm = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                key = self.headers.get("Authorization", "").removeprefix("Bearer ")
                llm.requests.append({"key": key, "path": self.path, "body": body})
                if key in llm.hold:
                    llm.hold[key].wait(60)
                queue = llm.replies.get(key) or [{"role": "assistant", "content": "0"}]
                message = queue.pop(0)
                out = {
                    "id": "c1", "object": "chat.completion", "created": 0, "model": body["model"],
                    "choices": [{"index": 0, "message": message,
                                 "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}],
                }
                data = json.dumps(out).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def stack():
    moto = engine.MotoServer().start()
    resources.create_bucket(moto, BUCKET, result_function_arn=None)
    llm = ScriptedLLM()
    acr = AcrEmulator({TOY_ARN: "local.agents.toy_agent:app", MATH_ARN: "local.agents.math_agent:app"},
                      tps_limit=50, agent_env=engine.endpoint_env(moto.endpoint))
    acr.start()
    client = boto3.client("bedrock-agentcore", region_name="us-east-1", endpoint_url=acr.url,
                          config=Config(retries={"total_max_attempts": 1, "mode": "standard"}))
    yield moto, llm, acr, client
    acr.stop()
    llm.server.shutdown()
    moto.stop()


def _invoke(client, llm, arn, payload, *, sid=None):
    sid = sid or str(uuid.uuid4())
    payload = {**payload, "_rollout": {"exp_id": "rollout-results/run-1", "input_id": "3", "s3_bucket": BUCKET,
                                       "base_url": llm.url, "model_id": "stepwise-tiny", "api_key": sid,
                                       "temperature": 1.0, "max_new_tokens": 8}}
    resp = client.invoke_agent_runtime(agentRuntimeArn=arn, runtimeSessionId=sid, payload=json.dumps(payload).encode())
    return sid, resp


def _result(key, timeout=30.0):
    s3 = boto3.client("s3")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
        except s3.exceptions.NoSuchKey:
            time.sleep(0.1)
    return None


def test_arn_names_its_agent_module():
    assert agent_spec_for_arn(TOY_ARN) == "local.agents.toy_agent:app"
    with pytest.raises(ValueError, match="runtime"):
        agent_spec_for_arn("arn:aws:lambda:us-east-1:123456789012:function:x")


def test_toy_agent_round_trip_writes_reward(stack):
    _moto, llm, _acr, client = stack
    sid = str(uuid.uuid4())
    llm.replies[sid] = [{"role": "assistant", "content": "4"}]
    _, resp = _invoke(client, llm, TOY_ARN, {"prompt": "What digit comes after 3?", "answer": "4"}, sid=sid)
    assert resp["runtimeSessionId"] == sid
    ack = json.loads(resp["response"].read())
    assert ack["status"] == "processing"
    assert ack["result_key"] == f"rollout-results/run-1/3/{sid}.json"
    result = json.loads(_result(ack["result_key"]))
    assert result["rewards"] == 1.0 and result["status_code"] == 200
    sent = [r for r in llm.requests if r["key"] == sid][0]
    assert sent["path"] == "/v1/chat/completions"
    assert sent["body"]["messages"][-1]["content"] == "What digit comes after 3?"
    assert sent["body"]["temperature"] == 1.0 and sent["body"]["max_tokens"] == 8


def test_math_agent_uses_calculator_then_answers(stack):
    _moto, llm, _acr, client = stack
    sid = str(uuid.uuid4())
    llm.replies[sid] = [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "3 * 68"}'}}]},
        {"role": "assistant", "content": "3 dozen cost 204.\n#### 204"},
    ]
    _, resp = _invoke(client, llm, MATH_ARN, {"prompt": "3 dozen at $68 a dozen?", "answer": "204"}, sid=sid)
    ack = json.loads(resp["response"].read())
    result = json.loads(_result(ack["result_key"]))
    assert result["rewards"] == 1.0 and result["tool_calls"] == 1
    second = [r for r in llm.requests if r["key"] == sid][1]["body"]
    assert second["tools"][0]["function"]["name"] == "calculator"
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": "call_1", "content": "204"}


def test_strict_reward_and_calculator():
    assert strict_reward("so #### 1,204", "1204") == 1.0
    assert strict_reward("the answer is 1204", "1204") == 0.0  # strict: no #### -> 0
    assert strict_reward("#### 12 then #### 13", "13") == 1.0
    assert calculate("(3 * 68) + 2 ** 3") == "212"
    assert calculate("__import__('os')").startswith("error")


def test_tps_limit_throttles_like_acr():
    acr = AcrEmulator({}, tps_limit=2, autostart=False).start()
    try:
        client = boto3.client("bedrock-agentcore", region_name="us-east-1", endpoint_url=acr.url,
                              config=Config(retries={"total_max_attempts": 1, "mode": "standard"}))
        codes = []
        for _ in range(4):
            try:
                client.invoke_agent_runtime(agentRuntimeArn=TOY_ARN, payload=b"{}")
            except client.exceptions.ThrottlingException:
                codes.append("throttled")
            except client.exceptions.ResourceNotFoundException:
                codes.append("not_found")  # under the limit; no agent mapped
        assert codes[:2] == ["not_found", "not_found"] and "throttled" in codes[2:]
        assert acr.counters.throttled >= 1
    finally:
        acr.stop()


def test_injected_faults(stack):
    _moto, llm, acr, client = stack
    acr.inject(throttle=1)
    with pytest.raises(client.exceptions.ThrottlingException):
        _invoke(client, llm, TOY_ARN, {"prompt": "What digit comes after 1?", "answer": "2"})
    acr.inject(invoke_error=1)
    with pytest.raises(client.exceptions.InternalServerException):
        _invoke(client, llm, TOY_ARN, {"prompt": "What digit comes after 1?", "answer": "2"})

    acr.inject(error_result=1)
    _, resp = _invoke(client, llm, TOY_ARN, {"prompt": "What digit comes after 1?", "answer": "2"})
    assert json.loads(_result(json.loads(resp["response"].read())["result_key"]))["status_code"] == 500

    acr.inject(malformed_result=1)
    _, resp = _invoke(client, llm, TOY_ARN, {"prompt": "What digit comes after 1?", "answer": "2"})
    with pytest.raises(json.JSONDecodeError):
        json.loads(_result(json.loads(resp["response"].read())["result_key"]))

    acr.inject(drop_result=1)
    before = len(llm.requests)
    _, resp = _invoke(client, llm, TOY_ARN, {"prompt": "What digit comes after 1?", "answer": "2"})
    assert _result(json.loads(resp["response"].read())["result_key"], timeout=1.5) is None
    assert len(llm.requests) == before  # the agent never ran

    with pytest.raises(ValueError, match="unknown fault"):
        acr.inject(explode=1)


def test_unknown_runtime_is_not_found(stack):
    _moto, llm, _acr, client = stack
    with pytest.raises(client.exceptions.ResourceNotFoundException):
        client.invoke_agent_runtime(
            agentRuntimeArn="arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/no_such_agent-x", payload=b"{}")


# ------------------------------------------------------------------------------ control plane and scoping


def _control(acr, region="us-east-1"):
    return boto3.client("bedrock-agentcore-control", region_name=region, endpoint_url=acr.url,
                        config=Config(retries={"total_max_attempts": 1, "mode": "standard"}))


def test_get_agent_runtime_answers_for_hosted_runtimes_in_botocores_shape(stack):
    import botocore.session

    _moto, _llm, acr, _client = stack
    rt = _control(acr).get_agent_runtime(agentRuntimeId="toy_agent-local")
    required = botocore.session.get_session().get_service_model("bedrock-agentcore-control") \
        .operation_model("GetAgentRuntime").output_shape.required_members
    assert set(required) <= set(rt)  # botocore parsed every member its model requires
    assert rt["agentRuntimeArn"] == TOY_ARN and rt["status"] == "READY"
    # autostart hosts a runtime by its module name, without starting it, in the emulator's region only
    auto = _control(acr).get_agent_runtime(agentRuntimeId="scripted_reward_agent-zz")
    assert auto["agentRuntimeArn"] == "arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/scripted_reward_agent-zz"
    for region, rid in (("us-east-1", "no_such_agent-x"), ("us-west-2", "toy_agent-local")):
        with pytest.raises(ClientError) as e:
            _control(acr, region).get_agent_runtime(agentRuntimeId=rid)
        assert e.value.response["Error"]["Code"] == "ResourceNotFoundException"
        assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404


def test_invokes_outside_the_stacks_region_or_allow_list_are_denied_like_iam(stack):
    _moto, llm, acr, client = stack
    west = "arn:aws:bedrock-agentcore:us-west-2:123456789012:runtime/toy_agent-west"
    acr.host(west)  # it exists in us-west-2 ...
    assert _control(acr, "us-west-2").get_agent_runtime(agentRuntimeId="toy_agent-west")["agentRuntimeArn"] == west
    started = set(acr._agents)
    denied = acr.counters.access_denied
    with pytest.raises(client.exceptions.AccessDeniedException, match="InvokeAgentRuntime on resource") as e:
        _invoke(client, llm, west, {"prompt": "p"})  # ... but the stack grants runtime/* of us-east-1 only
    errors = {sh.name: sh.metadata["error"]["httpStatusCode"] for sh in client.meta.service_model
              .operation_model("InvokeAgentRuntime").error_shapes}
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == errors["AccessDeniedException"]
    with pytest.raises(client.exceptions.ResourceNotFoundException) as e:
        _invoke(client, llm, "arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/no_such_agent-x", {})
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == errors["ResourceNotFoundException"]
    assert acr.counters.access_denied == denied + 1 and set(acr._agents) == started  # no agent ran
    acr.allowed_runtime_arns = (west,)
    try:
        with pytest.raises(client.exceptions.AccessDeniedException):  # the allow-list is the whole grant
            _invoke(client, llm, TOY_ARN, {"prompt": "p"})
        assert acr.may_invoke(west) and acr.may_invoke(f"{west}/runtime-endpoint/DEFAULT")
    finally:
        acr.allowed_runtime_arns = ()


def test_iam_matching_of_the_emulator_agrees_with_inits_scope_check():
    """Two independent readings of the stack's grant (IAM wildcards in the emulator, the pure
    `StackScope.may_invoke` Init refuses with) agree on every ARN."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from stepwise.core.preflight import StackScope

    regions = st.sampled_from(["us-east-1", "us-west-2", "eu-west-1"])
    accounts = st.sampled_from(["123456789012", "999999999999"])
    names = st.from_regex(r"[a-z][a-z_]{0,6}-[A-Za-z0-9]{1,10}", fullmatch=True)
    arns = st.builds(lambda r, a, n: f"arn:aws:bedrock-agentcore:{r}:{a}:runtime/{n}", regions, accounts, names)

    @settings(max_examples=200, deadline=None)
    @given(arn=arns, region=regions, allowed=st.lists(arns, max_size=3))
    def agree(arn, region, allowed):
        acr = AcrEmulator(region=region, account="123456789012", allowed_runtime_arns=allowed)
        scope = StackScope(region=region, bucket="b", agent_runtime_arns=tuple(allowed), account="123456789012")
        assert acr.may_invoke(arn) == scope.may_invoke(arn)

    agree()


def _wait_for(predicate, timeout=20.0, step=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


def test_runtime_sessions_end_when_idle_or_too_old_and_a_hung_agent_writes_nothing(stack):
    """ACR's lifecycle, scaled down: a finished rollout's session ends after the idle timeout; a hung
    one is busy (never idle) and ends at the maximum lifetime, its agent's work cancelled."""
    moto, llm, _acr, _client = stack
    acr = AcrEmulator({TOY_ARN: "local.agents.toy_agent:app"}, agent_env=engine.endpoint_env(moto.endpoint),
                      lifecycle=SessionLifecycle(idle_timeout_s=1.0, max_lifetime_s=4.0, session_quota=None)).start()
    try:
        client = boto3.client("bedrock-agentcore", region_name="us-east-1", endpoint_url=acr.url,
                              config=Config(retries={"total_max_attempts": 1, "mode": "standard"}))
        done, _ = _invoke(client, llm, TOY_ARN, {"prompt": "What digit comes after 3?", "answer": "4"})
        hung = str(uuid.uuid4())
        llm.hold[hung] = threading.Event()
        _, resp = _invoke(client, llm, TOY_ARN, {"prompt": "What digit comes after 5?", "answer": "6"}, sid=hung)
        hung_key = json.loads(resp["response"].read())["result_key"]
        assert acr.session_counters()["sessions_active"] == 2
        assert _wait_for(lambda: acr.sessions[done].ended is not None, timeout=10)
        assert acr.sessions[done].end_reason == "idle_timeout"
        assert acr.sessions[hung].ended is None, "a session whose agent is busy is not idle"
        assert _wait_for(lambda: acr.sessions[hung].ended is not None, timeout=10)
        session = acr.sessions[hung]
        assert session.end_reason == "max_lifetime" and session.ended - session.started >= 4.0
        llm.hold[hung].set()  # the LLM answers after the microVM is gone: nothing reaches S3
        assert _result(hung_key, timeout=2.0) is None
        counters = acr.session_counters()
        assert counters["sessions_started"] == 2 and counters["sessions_timed_out"] == 2
        assert counters["sessions_active"] == 0 and counters["sessions_stopped"] == 0
        assert counters["peak_active_sessions"] == 2
        assert 4.0 <= counters["session_seconds"] <= 4.0 + 1.0 + 2 * 3.0  # the hung one's 4 s plus the idle one's
    finally:
        acr.stop()


def test_stop_ends_the_session_and_the_quota_refuses_new_sessions_like_acr(stack):
    moto, llm, _acr, _client = stack
    acr = AcrEmulator({TOY_ARN: "local.agents.toy_agent:app"}, agent_env=engine.endpoint_env(moto.endpoint),
                      lifecycle=SessionLifecycle(session_quota=2)).start()
    try:
        client = boto3.client("bedrock-agentcore", region_name="us-east-1", endpoint_url=acr.url,
                              config=Config(retries={"total_max_attempts": 1, "mode": "standard"}))
        first, second = str(uuid.uuid4()), str(uuid.uuid4())
        for sid in (first, second):
            llm.hold[sid] = threading.Event()
        keys = {}
        for sid in (first, second):
            _, resp = _invoke(client, llm, TOY_ARN, {"prompt": "What digit comes after 1?", "answer": "2"}, sid=sid)
            keys[sid] = json.loads(resp["response"].read())["result_key"]
        with pytest.raises(client.exceptions.ServiceQuotaExceededException) as refused:
            _invoke(client, llm, TOY_ARN, {"prompt": "What digit comes after 1?", "answer": "2"})
        assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 402
        assert acr.session_counters()["quota_refusals"] == 1 and acr.session_counters()["sessions_started"] == 2

        resp = client.stop_runtime_session(agentRuntimeArn=TOY_ARN, runtimeSessionId=first)
        assert resp["runtimeSessionId"] == first
        assert acr.sessions[first].end_reason == "stopped"
        llm.hold[first].set()
        assert _result(keys[first], timeout=2.0) is None, "a stopped session's agent writes nothing"
        with pytest.raises(client.exceptions.ResourceNotFoundException):  # already terminated
            client.stop_runtime_session(agentRuntimeArn=TOY_ARN, runtimeSessionId=first)
        with pytest.raises(client.exceptions.ResourceNotFoundException):  # never started
            client.stop_runtime_session(agentRuntimeArn=TOY_ARN, runtimeSessionId=str(uuid.uuid4()))
        # the stop freed a place under the quota
        _invoke(client, llm, TOY_ARN, {"prompt": "What digit comes after 2?", "answer": "3"})

        import urllib.request

        with urllib.request.urlopen(f"{acr.url}/_acr/state", timeout=5) as r:
            state = json.loads(r.read())
        assert {"sessions_started", "sessions_stopped", "sessions_timed_out", "sessions_active",
                "peak_active_sessions", "session_seconds"} <= set(state["counters"])
        assert state["counters"]["sessions_stopped"] == 1 and state["counters"]["sessions_active"] == 2
        assert second in state["active"] and first not in state["active"]
    finally:
        for event in llm.hold.values():
            event.set()
        acr.stop()
