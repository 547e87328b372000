"""Per-turn vs trajectory rewards on the two-turn toy task, through the simulator's engine in-process.

The same comparison as ``benchmarks/credit_two_turn.py`` without Step Functions, the ACR emulator
or the gateway, so many seeds fit in minutes on a loaded 2-core machine: each step samples, for 8
prompts x 8 responses, the two-turn agent's two LLM calls from the simulator's own ``Sampler`` (the
chat template the gateway renders, temperature 1, ``maxTokens`` 16), scores the first call like
``local/agents/two_turn_agent.py``, replays the two turns into TraceRecords with
``stepwise.core.replay.replay_session`` (two trajectory-tree leaves), computes the datums with
``stepwise.core.steps.compute_step`` under the arm's config (``examples/two_turn.json`` and the
arm's overrides, as the pipeline benchmark), and trains with the simulator's ``forward_backward``
(``importance_sampling``) and ``optimizer_step`` (Adam, the config's learning rate, LoRA rank 8 /
alpha 16). Prompts cycle through ``prepare_datasets/prepare_two_turn.py``'s rows (seed 0) as PlanStep
does. What it leaves out: the pipeline's orchestration, which does not change the datums.

Usage: ``python -m benchmarks.credit_two_turn_sim --seeds 0,1,2 --steps 20`` (prints the same table
as ``credit_two_turn``; writes ``runs-bench/credit_two_turn_sim.json``).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks._common import DEFAULT_OUT, REPO_ROOT, load_average, write_result
from benchmarks.credit_two_turn import ARMS, summarize


def _overrides(arm: str) -> dict[str, Any]:
    return {k: json.loads(v) for k, v in (s.split("=", 1) for s in ARMS[arm])}


def run(arm: str, seed: int, steps: int) -> list[float]:
    """One arm and seed: the mean first-turn reward of each step's 64 rollouts."""
    import torch
    from transformers import AutoTokenizer

    from local.agents import toy_task
    from local.simulator import engine
    from local.simulator.model import ASSETS_DIR
    from prepare_datasets.prepare_two_turn import sample_payloads
    from stepwise.config import RunConfig
    from stepwise.core.replay import record_to_json, replay_session
    from stepwise.core.steps import compute_step
    from stepwise.records import RolloutRecord

    raw = json.loads((REPO_ROOT / "examples" / "two_turn.json").read_text()) | _overrides(arm) | {"seed": seed}
    raw["dataset_path"] = "s3://bench/two_turn.jsonl"
    raw.pop("eval_dataset_path", None)
    raw["eval_every"] = 0
    cfg = RunConfig.model_validate(raw)
    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(str(ASSETS_DIR))
    eos = [tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    base = engine.base_model()
    trainer = engine.TrainerState.from_base(base, cfg.lora_rank, float(cfg.lora_alpha))
    rows = sample_payloads(steps * cfg.batch_size, 0)
    rng = random.Random(seed)
    per_turn = cfg.reward_granularity == "per_turn"
    rewards: list[float] = []
    for step in range(steps):
        sampler = engine.Sampler.from_weights(base, engine.snapshot_weights(trainer), eos, tok.decode)
        rollouts = []
        for p, payload in enumerate(rows[step * cfg.batch_size:(step + 1) * cfg.batch_size]):
            turns_G: list[list[dict[str, Any]]] = [[] for _ in range(cfg.responses_per_prompt)]
            for prompt in (payload["prompt"], payload["free_prompt"]):
                messages = toy_task.messages({**payload, "prompt": prompt})
                ids = tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False),
                                 add_special_tokens=False)
                samples = sampler.sample(list(ids), cfg.responses_per_prompt, {
                    "maxTokens": 16, "temperature": cfg.temperature, "seed": rng.getrandbits(62)})
                for member, s in enumerate(samples):
                    turns_G[member].append({
                        "turn": {"prompt_ids": list(ids), "output_ids": s["tokens"], "finish_reason": s["stopReason"],
                                 "output_log_probs": s["logprobs"]},
                        "prompt_messages": messages,
                        "response_message": {"role": "assistant", "content": tok.decode(s["tokens"])}})
            for member, turns in enumerate(turns_G):
                outcome = toy_task.score(payload, turns[0]["response_message"]["content"])
                replay = replay_session(f"s{step}-{p}-{member}", turns, outcome)
                rollouts.append(RolloutRecord(
                    sid=f"s{step}-{p}-{member}", i=p * cfg.responses_per_prompt + member, input_id=f"p{p}", row=p,
                    member=member, step=step, reward=outcome, status="ok", num_turns=2, policy_version=step,
                    records=[record_to_json(r) for r in replay.records],
                    turn_rewards=[outcome, 0.0] if per_turn else None,
                    turn_spans=replay.turn_spans if per_turn else None))
        outcome_ = compute_step([rollouts], cfg, policy_version=step)
        rewards.append(outcome_.metrics["sampler/mean_reward"])
        if outcome_.datums:
            engine.forward_backward(trainer, {"lossFnName": cfg.loss, "datumList": outcome_.datums}, backward=True)
            engine.optimizer_step(trainer, {"adamParamsConfig": {"learningRate": cfg.learning_rate}})
    return rewards


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arms", default="per_turn,trajectory", help=f"comma-separated, of {', '.join(ARMS)}")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--threshold", type=float, default=0.8)
    p.add_argument("--window", type=int, default=2)
    p.add_argument("--at-steps", default="5,10,15,20")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    arms = [a for a in args.arms.split(",") if a]
    seeds = [int(s) for s in args.seeds.split(",")]
    load_start, runs = load_average(), []
    for seed in seeds:
        for arm in arms:
            t0 = time.monotonic()
            rewards = run(arm, seed, args.steps)
            runs.append({"arm": arm, "seed": seed, "rewards": rewards, "wall_seconds": time.monotonic() - t0})
            print(f"[{arm} s{seed}] {time.monotonic() - t0:.0f} s, rewards " + " ".join(f"{r:.2f}" for r in rewards),
                  flush=True)
    table = summarize(runs, args.threshold, args.window, [int(k) for k in args.at_steps.split(",") if k])
    print(f"\nload {load_start} -> {load_average()}\n{table}")
    path = write_result(args.out, "credit_two_turn_sim", {"arms": arms, "seeds": seeds, "steps": args.steps,
                                                           "threshold": args.threshold, "window": args.window,
                                                           "runs": runs, "table": table})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
