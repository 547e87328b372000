"""The judged toy task: does the group judge's rubric teach what an answer key would, and does the judge agree
with the answer key?

Runs ``stepwise start --local examples/toy_judge.json`` (the toy agent without an answer key: its reward is a constant
0.0, the judge's score replaces it) with the local Bedrock emulator's judge wrong on ``--error-rate`` of the
attempts (``STEPWISE_LOCAL_BEDROCK_ERROR_RATE``; 0 = the rubric applied exactly), or reads a finished run folder
(``--run-dir``). Per step it prints:

- ``judged``: the mean reward the estimator read (the judge's score mapped to [0, 1]: ``sampler/mean_reward``);
- ``correct``: the fraction of the step's rollouts whose reply is the right digit (the known answer, read from
  each rollout's captured turn: the toy question and the reply), i.e. what an answer key would have rewarded;
- ``agree``: the fraction of judged rollouts where the judge's verdict (the top score = right) matches the
  answer key, and ``rho``: the judge's rank correlation with the answer key within groups, averaged;
- the judge's requests, input and output tokens per group (the emulator's counts) and its USD per group at the
  price table's price for the run's model; and the run's greedy evals on ``toy_eval.jsonl``, whose payloads do
  carry the answer (the agent scores them exactly): ``eval/accuracy`` at each eval.

Usage: ``python -m benchmarks.judge_toy [--error-rate 0.2] [--steps 20]`` or ``--run-dir runs-local/RUN``.
Writes ``runs-bench/judge_toy.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks._common import DEFAULT_OUT, REPO_ROOT, load_average, write_result

CONFIG = REPO_ROOT / "examples" / "toy_judge.json"
_QUESTION = re.compile(r"What digit comes after (\d)\?")


def reply_is_right(turns: list[dict[str, Any]]) -> bool | None:
    """Whether a toy rollout's last reply is exactly the right digit (the toy agent's exact-match score); None
    when its turns hold no toy question."""
    from local.agents.toy_task import score

    for t in turns:
        for m in t.get("prompt_messages") or []:
            q = _QUESTION.search(str(m.get("content") or ""))
            if q:
                reply = (turns[-1].get("response_message") or {}).get("content")
                return score({"answer": str((int(q.group(1)) + 1) % 10)}, reply) == 1.0
    return None


def analyse(run_dir: Path) -> dict[str, Any]:
    """Per step: judged reward, correctness by the known answer, the judge's agreement with it, its tokens and
    cost per group; the run's evals."""
    from stepwise import layout
    from stepwise.config import load_run_config
    from stepwise.core.judge import spearman
    from stepwise.core.prices import bedrock_usd_per_million
    from stepwise.records import JudgeRecord
    from stepwise_cli.sources import DirStore

    run_id = run_dir.name
    store = DirStore(run_dir / "s3")
    cfg = load_run_config(store.get_json(layout.config_key(run_id)))
    price = bedrock_usd_per_million(cfg.judge.model_id) if cfg.judge else None
    steps = []
    for step in sorted(int(p.name) for p in (run_dir / "steps").iterdir() if p.name.isdigit()):
        summary = json.loads((run_dir / "steps" / str(step) / "summary.json").read_text())
        agree = total = right = 0
        rhos = []
        requests = tokens_in = tokens_out = groups = 0
        keys = [k for k in store.list_keys(layout.summaries_prefix(run_id, "steps") + f"{step}/") if "/judge/" in k]
        for key in keys:
            rec = JudgeRecord.model_validate(store.get_json(key))
            groups += 1
            if rec.usage:
                requests += rec.usage.judge_requests
                tokens_in += rec.usage.judge_input_tokens
                tokens_out += rec.usage.judge_output_tokens
            truth_G, score_G = [], []
            for sid, score in zip(rec.sids_G, rec.scores_G, strict=True):
                turns = [store.get_json(k) for k in store.list_keys(layout.turns_prefix(run_id, sid))] if sid else []
                truth = reply_is_right(turns) if turns else False
                total += 1
                right += bool(truth)
                if score is not None:
                    agree += (score >= cfg.judge.score_max) == bool(truth)
                    truth_G.append(float(bool(truth)))
                    score_G.append(float(score))
            if (rho := spearman(truth_G, score_G)) is not None:
                rhos.append(rho)
        row = {"step": step, "judged": summary.get("sampler/mean_reward"), "correct": right / total if total else None,
               "agree": agree / total if total else None, "rho": statistics.fmean(rhos) if rhos else None,
               "groups": groups, "fallback_groups": summary.get("judge/fallback_groups", 0),
               "requests_per_group": requests / groups if groups else None,
               "input_tokens_per_group": tokens_in / groups if groups else None,
               "output_tokens_per_group": tokens_out / groups if groups else None}
        if price is not None and groups:
            row["usd_per_group"] = (tokens_in * price[0] + tokens_out * price[1]) / 1e6 / groups
        steps.append(row)
    evals = {}
    for p in sorted((run_dir / "evals").iterdir() if (run_dir / "evals").exists() else [], key=lambda p: int(p.name)):
        s = json.loads((p / "summary.json").read_text())
        evals[int(p.name)] = s.get("eval/accuracy")
    return {"run_id": run_id, "model_id": cfg.judge.model_id if cfg.judge else None, "steps": steps, "evals": evals}


def table(result: dict[str, Any]) -> str:
    def f(v: Any, spec: str = ".3f") -> str:
        return "-" if v is None else format(v, spec)

    lines = ["step  judged  correct  agree    rho  groups  fallback  req/group  in/group  out/group   USD/group"]
    for r in result["steps"]:
        lines.append(f"{r['step']:>4}  {f(r['judged']):>6}  {f(r['correct']):>7}  {f(r['agree']):>5}  {f(r['rho'], '.2f'):>5}  "
                     f"{r['groups']:>6}  {r['fallback_groups']:>8g}  {f(r['requests_per_group'], '.2f'):>9}  "
                     f"{f(r['input_tokens_per_group'], '.0f'):>8}  {f(r['output_tokens_per_group'], '.0f'):>9}  "
                     f"{f(r.get('usd_per_group'), '.7f'):>10}")
    lines.append("evals (greedy, toy_eval.jsonl, the answer key): "
                 + ", ".join(f"step {k}: {f(v)}" for k, v in result["evals"].items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, help="analyse this finished run folder instead of running one")
    parser.add_argument("--error-rate", type=float, default=0.0, help="the emulator judge's error rate (default 0)")
    parser.add_argument("--steps", type=int, default=20, help="steps to run (default 20: the config's 160 prompts)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    run_dir = args.run_dir
    started = time.monotonic()
    if run_dir is None:
        from local.bedrock import ENV_ERROR_RATE
        from local.run import run_local

        os.environ[ENV_ERROR_RATE] = str(args.error_rate)
        result = run_local(CONFIG, out_root=args.out / "judge_toy", progress=False, quiet=True,
                           overrides={"max_prompts": args.steps * 8})
        run_dir = Path(result.run_dir)
    out = analyse(run_dir) | {"error_rate": args.error_rate, "seconds": round(time.monotonic() - started, 1),
                              "load_average": load_average()}
    print(table(out))
    write_result(args.out, "judge_toy", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
