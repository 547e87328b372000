"""A small finished-looking run written into a bucket as the pipeline writes it, for the readers of runs
(`stepwise rollouts`, `stepwise report`, the Track function).

Two train steps and an eval; each step has two groups of two rollouts of a calculator agent (a tool
call, its result, an answer), one failed rollout (timeout) and one zeroed reward. The captured turns
are tokenized with the tiny model's real tokenizer and the rollout records' TraceRecords come from
the real replay (`stepwise.core.replay.replay_turns`), as FinishRollout makes them.
"""

from __future__ import annotations

import json
import functools
from typing import Any

from stepwise import layout
from stepwise.core.replay import record_to_json, replay_turns
from tests.support.cli import BASE_CONFIG, run_state
from tests.support.gateway import TINY_MODEL, TOKENIZER_FILES

SYSTEM = {"role": "system", "content": "You are a calculator agent."}
CALL = {"role": "assistant", "content": "", "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "6*7"}'}}]}


@functools.lru_cache(maxsize=1)
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TINY_MODEL))


def ids(text: str) -> list[int]:
    return tokenizer().encode(text, add_special_tokens=False)


def turns_for(sid: str, question: str, answer: str) -> list[dict[str, Any]]:
    """Two captured turns: a tool call, then the answer after the tool's result."""
    user = {"role": "user", "content": question}
    tool = {"role": "tool", "tool_call_id": "call_1", "content": "42"}
    prompt1 = ids(f"<|im_start|>system\n{SYSTEM['content']}<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n"
                  "<|im_start|>assistant\n")
    out1 = ids('<tool_call>{"name": "calculator"}</tool_call><|im_end|>')
    prompt2 = prompt1 + out1 + ids("\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n")
    out2 = ids(f"{answer}<|im_end|>")

    def body(n, prompt_ids, output_ids, messages, response):
        return {"sid": sid, "turn": {"prompt_ids": prompt_ids, "output_ids": output_ids, "finish_reason": "stop",
                                     "output_log_probs": [-0.5] * len(output_ids), "ill_formed": False},
                "prompt_messages": messages, "response_message": response, "metadata": {},
                "sampler_model_package_arn": "", "policy_version": 1, "completed_at": 1000.0 + n}

    return [body(1, prompt1, out1, [SYSTEM, user], CALL),
            body(2, prompt2, out2, [SYSTEM, user, CALL, tool], {"role": "assistant", "content": answer})]


def config(**overrides: Any) -> dict[str, Any]:
    from stepwise.config import load_run_config

    return load_run_config({**BASE_CONFIG, "dataset_path": "s3://stepwise-cli-test/d.jsonl", **overrides}
                           ).model_dump(mode="json")


#: (step, kind) -> [(input_id, member, reward, answer, failure)]
PLAN: dict[tuple[int, str], list[tuple[str, int, float, str, str | None]]] = {
    (0, "train"): [("s0p0", 0, 1.0, "42", None), ("s0p0", 1, 0.0, "41", "timeout"),
                   ("s0p1", 0, 0.0, "40", "zeroed"), ("s0p1", 1, 0.0, "39", None)],
    (1, "train"): [("s1p0", 0, 1.0, "42", None), ("s1p0", 1, 1.0, "42", None),
                   ("s1p1", 0, 1.0, "42", None), ("s1p1", 1, 0.0, "7", None)],
    (1, "eval"): [("e1p0", 0, 1.0, "42", None), ("e1p1", 0, 0.0, "3", None)],
}


def sid_of(step: int, kind: str, i: int) -> str:
    return f"{kind[0]}{step}{i:02d}0000-0000-4000-8000-000000000000"


#: The group engine's (``admission: group``) groups each train step of `PLAN` consumed, in the order chosen
#: (step 1 takes its second prompt's group first): group ``2 x step + position``, attempt 0 or 1.
GROUPS: dict[int, list[tuple[int, int]]] = {0: [(0, 0), (1, 1)], 1: [(3, 0), (2, 0)]}


def write_run(put_json: Any, put_bytes: Any, run_id: str, *, execution_arn: str = "arn:exec", **cfg: Any) -> None:
    """The run's objects (config, state, summaries, rollout records, captured turns, tokenizer).

    With ``admission="group"`` in ``cfg`` the train steps' records are written as the group engine writes them:
    each group's in its own folder (`GROUPS`, ``runs/{run}/groups/{g}/a{n}/rollouts/``), each summary naming the
    groups it consumed, and with a ``judge`` each group's judge record beside its rollouts (member 0 scored 10
    and member 1 scored 0, whatever the agent's reward)."""
    put_json(layout.config_key(run_id), config(**cfg))
    engine = cfg.get("admission") == "group"
    put_json(layout.state_key(run_id), run_state(run_id, execution_arn, step=2, policy_version=2, checkpoints=[
        {"step": 2, "kind": "state", "reason": "final", "model_package_arn": "arn:aws:sagemaker:us-east-1:123456789012:model-package/g/2",
         "epoch": 0, "cursor": 0, "policy_version": 2}]))
    for name in TOKENIZER_FILES:
        put_bytes(layout.tokenizer_prefix(run_id) + name, (TINY_MODEL / name).read_bytes())
    for (step, kind), members in PLAN.items():
        rewards = []
        for i, (input_id, member, reward, answer, failure) in enumerate(members):
            sid = sid_of(step, kind, i)
            turns = turns_for(sid, f"What is 6*7? (row {i})", answer) if failure != "timeout" else []
            for n, t in enumerate(turns):
                put_json(layout.turns_prefix(run_id, sid) + f"{n:020d}-x-o{len(t['turn']['output_ids'])}.json", t)
            error = {"error": "States.Timeout", "cause": "no result in 120 s"} if failure == "timeout" else None
            record = {"sid": sid, "i": i, "input_id": input_id, "row": i, "member": member, "kind": kind, "step": step,
                      "generation_batch": 0, "reward": reward, "status": "timeout" if error else "ok", "error": error,
                      "reward_reason": "no reward in the result" if failure == "zeroed" else (
                          "timeout: States.Timeout: no result in 120 s" if error else None),
                      "num_turns": len(turns), "sampled_tokens": sum(len(t["turn"]["output_ids"]) for t in turns),
                      "tool_calls": 1 if turns else 0, "duration_s": 2.5, "policy_version": step,
                      "records": [record_to_json(r) for r in replay_turns(sid, turns, reward)]}
            if engine and kind == "train":
                g, attempt = next(ref for ref in GROUPS[step] if ref[0] == 2 * step + i // 2)
                v = step - (g == 3)  # group 3 sampled its first turn a version before the update that trained it
                record.update(group=g, policy_version=v, first_turn_version=v, last_turn_version=step,
                              turn_versions=[v, step][:len(turns)])
                put_json(layout.rollout_key(run_id, step, 0, sid, kind, group=g, attempt=attempt), record)
                if cfg.get("judge") and member == 1:
                    put_json(layout.judge_record_key(run_id, step, 0, input_id, group=g, attempt=attempt), {
                        "input_id": input_id, "step": step, "sids_G": [sid_of(step, kind, i - 1), sid],
                        "members_G": [0, 1], "judged_G": [True, True], "scores_G": [10.0, 0.0],
                        "reasons_G": ["the better answer", "the worse answer"], "judged_chars_G": [20, 20]})
            else:
                put_json(layout.rollout_key(run_id, step, 0, sid, kind), record)
            rewards.append(reward)
        mean = sum(rewards) / len(rewards)
        if kind == "train":
            put_json(layout.summary_key(run_id, step), {
                "step": step, "sampler/mean_reward": mean, "sampler/num_rollouts": len(rewards),
                "rollouts/num_error": 0, "rollouts/num_timeout": 1 if step == 0 else 0, "decision": "train",
                "behaviour/turns_per_rollout": 1.5, "policy_version": step + 1,
                **({"consumed_groups": [list(ref) for ref in GROUPS[step]], "filtered_groups": []} if engine else {})})
        else:
            put_json(layout.eval_summary_key(run_id, step), {"step": step, "eval/accuracy": mean, "eval/n": len(rewards)})


def write_to_s3(s3: Any, bucket: str, run_id: str, **cfg: Any) -> None:
    write_run(lambda k, o: s3.put_object(Bucket=bucket, Key=k, Body=json.dumps(o).encode()),
              lambda k, b: s3.put_object(Bucket=bucket, Key=k, Body=b), run_id, **cfg)
