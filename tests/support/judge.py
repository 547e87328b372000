"""What the group judge's tests share: moto's S3 on loopback and the Bedrock emulator (`local.bedrock`), the
real botocore clients pointed at both, and groups of the toy task written as FinishRollout and the gateway
leave them (rollout records, captured turns, the agent's result objects)."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest

from stepwise.layout import result_key, rollout_key, turns_prefix
from stepwise.records import RolloutRecord

MODEL = "us.amazon.nova-micro-v1:0"
RUBRIC = "A better attempt answers with the right digit, and nothing else."
BUCKET = "stepwise-judge-test"


def toy_turn(sid: str, n: int, reply: str) -> dict[str, Any]:
    """A captured turn of the toy agent asked the digit after ``n``, answering ``reply``."""
    return {"sid": sid, "turn": {"prompt_ids": [1, 2], "output_ids": [3, 4], "finish_reason": "stop",
                                 "output_log_probs": [-0.5, -0.5], "ill_formed": False},
            "prompt_messages": [{"role": "system", "content": "Reply with one digit."},
                                {"role": "user", "content": f"What digit comes after {n}?"}],
            "response_message": {"role": "assistant", "content": reply}, "metadata": {}}


class JudgeBench:
    """moto (S3) on loopback and a Bedrock emulator granting ``granted``, the environment set for both."""

    def __init__(self, granted: tuple[str, ...] = (MODEL,)) -> None:
        from local import engine
        from local.bedrock import BedrockEmulator

        self.moto = engine.MotoServer().start()
        self.bedrock = BedrockEmulator(region="us-east-1", allowed_model_ids=granted, slow_seconds=2.0).start()
        self.mp = pytest.MonkeyPatch()
        for k, v in {**self.bedrock.env, "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1",
                     "STEPWISE_BUCKET": BUCKET, "STEPWISE_JUDGE_MODEL_IDS": ",".join(granted)}.items():
            self.mp.setenv(k, v)
        self.s3 = self.moto.client("s3")
        try:
            self.s3.create_bucket(Bucket=BUCKET)
        except self.s3.exceptions.BucketAlreadyOwnedByYou:
            pass
        from stepwise.aws.runstore import RunStore

        self.store = RunStore(BUCKET)

    def stop(self) -> None:
        self.bedrock.stop()
        self.mp.undo()
        self.moto.stop()

    def reset(self) -> None:
        """Faults disarmed, counters and recorded requests cleared."""
        from local.bedrock import BedrockCounters, Faults

        self.bedrock.faults, self.bedrock.counters, self.bedrock.requests = Faults(), BedrockCounters(), []

    def put_group(self, run_id: str, n: int, replies: list[str], *, step: int = 0, generation_batch: int = 0,
                  input_id: str | None = None, statuses: list[str] | None = None,
                  rewards: list[float] | None = None) -> list[RolloutRecord]:
        """A group of the toy question "what digit comes after ``n``?" whose member k replied ``replies[k]``
        (status ``statuses[k]``, the agent's reward ``rewards[k]``), as the pipeline leaves it in S3."""
        input_id = input_id or f"s{step}g{generation_batch}p{n}"
        out = []
        for k, reply in enumerate(replies):
            sid = str(uuid.uuid4())
            status = (statuses or ["ok"] * len(replies))[k]
            if status == "ok":
                self.s3.put_object(Bucket=BUCKET, Key=f"{turns_prefix(run_id, sid)}{time.time_ns():020d}.json",
                                   Body=json.dumps(toy_turn(sid, n, reply)).encode())
                self.s3.put_object(Bucket=BUCKET, Key=result_key(run_id, input_id, sid),
                                   Body=json.dumps({"rewards": 0.0, "answer": reply, "status_code": 200}).encode())
            r = RolloutRecord(sid=sid, i=len(out) + 100 * n, input_id=input_id, row=n, member=k, step=step,
                              generation_batch=generation_batch, reward=(rewards or [0.0] * len(replies))[k],
                              status=status, num_turns=1 if status == "ok" else 0)
            self.s3.put_object(Bucket=BUCKET, Key=rollout_key(run_id, step, generation_batch, sid),
                               Body=r.model_dump_json().encode())
            out.append(r)
        return out


def judge_config(**judge: Any) -> Any:
    """A valid run config with a judge (``judge`` over the defaults here)."""
    from tests.support.planning import cfg

    return cfg(region="us-east-1", judge={"model_id": MODEL, "rubric": RUBRIC, **judge})


def roll_out_toy(stack: Any, run_id: str, plan: dict[str, Any], right: Any, reward: Any = None) -> list[dict[str, Any]]:
    """Run FinishRollout for every item of a planned batch of toy prompts (``plan``: its ``items_key`` and ``batch``;
    a group engine's group's too), as if the agent replied the right digit when ``right(item)`` is true and a wrong
    one otherwise (one captured turn each, reward ``reward(item)``, else 0.0: no answer key)."""
    from prepare_datasets.prepare_toy import NUM_PROMPTS
    from stepwise.events import FinishEvent
    from stepwise.handlers.rollout import finish
    from tests.support.pipeline import run_ref

    items = json.loads(stack.s3.get_object(Bucket=stack.bucket, Key=plan["items_key"])["Body"].read())
    prompts = json.loads(stack.s3.get_object(Bucket=stack.bucket,
                                             Key=plan["items_key"].replace("items.json", "prompts.json"))["Body"].read())
    outs = []
    for item in items:
        sid = str(uuid.uuid4())
        n = int(prompts[item["input_id"]]["prompt"].split()[-1].rstrip("?"))
        reply = str((n + 1) % NUM_PROMPTS) if right(item) else str((n + 5) % NUM_PROMPTS)
        stack.s3.put_object(Bucket=stack.bucket, Key=f"{turns_prefix(run_id, sid)}{time.time_ns():020d}.json",
                            Body=json.dumps(toy_turn(sid, n, reply)).encode())
        key = result_key(run_id, item["input_id"], sid)
        stack.s3.put_object(Bucket=stack.bucket, Key=key,
                            Body=json.dumps({"rewards": float(reward(item)) if reward else 0.0, "answer": reply,
                                             "status_code": 200}).encode())
        outs.append(finish(FinishEvent.model_validate({"run": run_ref(run_id), "batch": plan["batch"], "item": item,
                                                       "result": {"sid": sid, "result_key": key}, "error": None})))
    return outs


#: A judged run's reasons and figures (`write_judged_run`).
JUDGED_GOOD, JUDGED_POOR = "uses the calculator and answers 42", "answers 42 but skips the check"
JUDGED_FALLBACK = "the judge's answers were invalid 3 times (attempt 2 is missing)"
JUDGED_METRICS = {"judge/agreement_spearman": 0.5, "judge/length_spearman": -0.25, "judge/length_bias_alarm": 0.0,
                  "judge/fallback_groups": 1.0}


def write_judged_run(store: Any, run_id: str) -> None:
    """`tests.support.runs.write_run`'s run (two steps of a calculator agent, real TraceRecords) with a judge in
    its config (``combine: replace``, ``fallback: agent_reward``) and the judge's records of step 1: group
    ``s1p0`` (the agent rewarded both members 1.0) scored 8 and 3 (`JUDGED_GOOD`, `JUDGED_POOR`), group ``s1p1``
    fallen back (`JUDGED_FALLBACK`); step 1's summary carries `JUDGED_METRICS`. ``store``: ``put_bytes`` and
    ``get_bytes`` (a `stepwise_cli.sources.DirStore`)."""
    from stepwise import layout
    from stepwise.records import JudgeRecord
    from tests.support.runs import sid_of, write_run

    def put_json(key: str, obj: Any) -> None:
        store.put_bytes(key, json.dumps(obj).encode())

    write_run(put_json, store.put_bytes, run_id, judge={
        "model_id": MODEL, "rubric": "A better attempt answers 42 after using the calculator.",
        "fallback": "agent_reward"})
    sids = [sid_of(1, "train", i) for i in range(4)]
    put_json(layout.judge_record_key(run_id, 1, 0, "s1p0"), JudgeRecord(
        input_id="s1p0", step=1, sids_G=sids[:2], members_G=[0, 1], judged_G=[True, True], scores_G=[8.0, 3.0],
        reasons_G=[JUDGED_GOOD, JUDGED_POOR], judged_chars_G=[300, 280], model_id=MODEL).model_dump(mode="json"))
    put_json(layout.judge_record_key(run_id, 1, 0, "s1p1"), JudgeRecord(
        input_id="s1p1", step=1, sids_G=sids[2:], members_G=[0, 1], judged_G=[True, True], scores_G=[None, None],
        reasons_G=["", ""], judged_chars_G=[300, 280], source="fallback", fallback_reason=JUDGED_FALLBACK,
        attempts=3).model_dump(mode="json"))
    summary = json.loads(store.get_bytes(layout.summary_key(run_id, 1)))
    put_json(layout.summary_key(run_id, 1), {**summary, **JUDGED_METRICS})
