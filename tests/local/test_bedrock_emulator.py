"""The Bedrock emulator (`local.bedrock`) as boto3 sees it: scoped like the stack's IAM grant, the models it hosts
and how they may be invoked, its judge read from the rubric, its faults, its token counts, and the local stack
starting it with the config's judge model granted."""

from __future__ import annotations


import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from local.bedrock import BedrockEmulator, Faults, JudgeCall, from_env, last_reply, read_call, rubric_rules

MODEL = "us.amazon.nova-micro-v1:0"


@pytest.fixture(scope="module")
def emulator():
    with BedrockEmulator(region="us-east-1", allowed_model_ids=(MODEL, "amazon.nova-lite-v1:0",
                                                                  "anthropic.claude-haiku-4-5-20251001-v1:0")) as e:
        yield e


def client(emulator, service: str = "bedrock-runtime"):
    return boto3.client(service, region_name="us-east-1", endpoint_url=emulator.url, aws_access_key_id="x",
                        aws_secret_access_key="y", config=Config(retries={"total_max_attempts": 1}))


def request(model: str = MODEL, attempts=("[assistant]\n4", "[assistant]\n9"), rubric="the right digit") -> dict:
    text = "<task>\n[user]\nWhat digit comes after 3?\n</task>\n\n" + "\n\n".join(
        f"<attempt {k}>\n{a}\n</attempt {k}>" for k, a in enumerate(attempts, 1))
    return {"modelId": model, "system": [{"text": f"<rubric>\n{rubric}\n</rubric>"}],
            "messages": [{"role": "user", "content": [{"text": text}]}],
            "toolConfig": {"tools": [{"toolSpec": {"name": "record_scores", "inputSchema": {"json": {"properties": {
                "scores": {"items": {"properties": {"score": {"minimum": 1, "maximum": 5}}}}}}}}}],
                "toolChoice": {"tool": {"name": "record_scores"}}}}


def scores(response: dict) -> list[tuple[float, str]]:
    use = response["output"]["message"]["content"][0]["toolUse"]
    return [(e["score"], e["reason"]) for e in use["input"]["scores"]]


def test_converse_answers_a_tool_call_scoring_by_the_rubric_in_its_range_and_counts_tokens(emulator):
    before = emulator.counters.input_tokens
    r = client(emulator).converse(**request())
    assert r["stopReason"] == "tool_use" and scores(r) == [(5, "names the right digit 4"), (1, "answers '9', not the digit 4")]
    assert r["usage"]["inputTokens"] > 0 and emulator.counters.input_tokens - before == r["usage"]["inputTokens"]


def test_the_stack_s_grant_scopes_converse_like_iam(emulator):
    with pytest.raises(ClientError, match="AccessDeniedException"):
        client(emulator).converse(**request("amazon.nova-pro-v1:0"))
    profile_arn = "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.amazon.nova-micro-v1:0"
    assert client(emulator).converse(**request(profile_arn))["stopReason"] == "tool_use"  # the granted profile, by ARN
    with pytest.raises(ClientError, match="on-demand throughput isn't supported"):
        client(emulator).converse(**request("anthropic.claude-haiku-4-5-20251001-v1:0"))
    nothing = BedrockEmulator()
    assert not nothing.may_invoke(MODEL)  # no judgeModelIds: nothing granted


@pytest.mark.parametrize("fault", [f for f in Faults.__dataclass_fields__ if f != "slow"])
def test_each_fault_answers_as_bedrock_would_once(emulator, fault):
    emulator.inject(**{fault: 1})
    c = client(emulator)
    if fault in ("throttle", "unavailable"):
        with pytest.raises(ClientError, match={"throttle": "ThrottlingException",
                                               "unavailable": "ServiceUnavailableException"}[fault]):
            c.converse(**request())
    else:
        content = c.converse(**request())["output"]["message"]["content"][0]
        if fault == "malformed":
            assert "toolUse" not in content and "{" in content["text"]
        else:
            entries = content["toolUse"]["input"]["scores"]
            assert {"out_of_range": entries[0]["score"] == 10, "missing_member": len(entries) == 1,
                    "duplicate_member": len(entries) == 3}[fault]
    assert scores(c.converse(**request()))[0][0] == 5  # one call, then clean again


def test_model_lookups_answer_for_hosted_models_in_the_signed_region(emulator):
    ctl = client(emulator, "bedrock")
    d = ctl.get_foundation_model(modelIdentifier="amazon.nova-micro-v1:0")["modelDetails"]
    assert d["inferenceTypesSupported"] == ["ON_DEMAND", "INFERENCE_PROFILE"] and d["modelLifecycle"]["status"] == "ACTIVE"
    p = boto3.client("bedrock", region_name="eu-west-1", endpoint_url=emulator.url, aws_access_key_id="x",
                     aws_secret_access_key="y").get_inference_profile(inferenceProfileIdentifier="eu.amazon.nova-micro-v1:0")
    assert p["inferenceProfileArn"] == "arn:aws:bedrock:eu-west-1:123456789012:inference-profile/eu.amazon.nova-micro-v1:0"
    with pytest.raises(ClientError, match="ResourceNotFoundException"):
        ctl.get_foundation_model(modelIdentifier="amazon.titan-text-v1:0")


def test_the_judge_reads_the_rubric_a_length_rule_and_an_error_rate():
    call = JudgeCall(rubric="Prefer the right digit.", task="[user]\nWhat digit comes after 9?",
                     attempts=["[assistant]\n0", "[assistant]\n0 or 1", "[assistant]\n<think>hm 0</think>5"], lo=0, hi=10)
    assert [s for s, _ in rubric_rules(call)] == [10, 3, 0]
    longer = JudgeCall(rubric="longer is better", task="", attempts=["a", "aaa", "aa"], lo=0, hi=10)
    assert [s for s, _ in rubric_rules(longer)] == [0, 10, 5]
    assert rubric_rules(JudgeCall(rubric="be kind", task="", attempts=["x"], lo=0, hi=4)) == [
        (2, "the local judge has no rule for this rubric")]
    assert last_reply("[assistant]\n7\n\n[the agent's result]\n{}") == "7"


def test_an_erring_judge_is_wrong_on_about_its_rate_and_always_the_same_way():
    with BedrockEmulator(allowed_model_ids=(MODEL,), error_rate=0.3) as e:
        c = client(e)
        attempts = [f"[assistant]\n4 ({k})" for k in range(40)]
        first = scores(c.converse(**request(attempts=attempts)))
        again = scores(c.converse(**request(attempts=attempts)))
    wrong = sum(1 for s, r in first if r.startswith("(misjudged)"))
    assert first == again and 4 <= wrong <= 20


def test_the_local_stack_s_emulator_takes_its_grant_faults_and_error_rate_from_the_environment():
    e = from_env({"STEPWISE_JUDGE_MODEL_IDS": f"{MODEL}, amazon.nova-lite-v1:0",
                  "STEPWISE_LOCAL_BEDROCK_FAULTS": "throttle=2,malformed", "STEPWISE_LOCAL_BEDROCK_ERROR_RATE": "0.1"})
    assert e.allowed_model_ids == (MODEL, "amazon.nova-lite-v1:0") and e.error_rate == 0.1
    assert (e.faults.throttle, e.faults.malformed) == (2, 1)
    with pytest.raises(ValueError, match="unknown Bedrock fault 'thottle'"):
        Faults.parse("thottle=1")


def test_a_request_that_is_not_a_judge_s_is_refused():
    with pytest.raises(ValueError, match="no <attempt k>"):
        read_call({"messages": [{"role": "user", "content": [{"text": "hello"}]}]})
