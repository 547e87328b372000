"""DAPO through the local stack with a known mix of prompts (what DAPO's dynamic sampling must do).

The real state machine on moto, the real handlers, the gateway, the ACR emulator in front of
`local.agents.scripted_reward_agent` (rewards fixed by the dataset: always solved, never solved,
mixed), and the SageMaker simulator. ``batch_size`` 2, K = 2, ``max_num_gen_batches`` 3:

step 0: gen0 [solved, unsolved] -> 0 kept; gen1 [mixed, unsolved] -> 1; gen2 [mixed, mixed] -> 2
        kept + 1 surplus -> train on exactly gen1/p0 and gen2/p0 (3 generation batches predicted;
        filtered fraction 3/6: the all-equal groups of the mix).
step 1: gen0 [solved, solved]; gen1 [unsolved, mixed]; gen2 [solved, unsolved] -> 1/2 kept after
        3 generation batches: the cap. A final checkpoint is saved, the final eval runs, and the
        run SUCCEEDS with the reason in the execution output.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from local import run as run_module
from local.run import run_local
from prepare_datasets import prepare_toy

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "toy_dapo.json"
AGENT = "arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/scripted_reward_agent-local"

pytestmark = pytest.mark.e2e

S, U, M = [1.0], [0.0], [1.0, 0.0]  # always solved, never solved, mixed (rewards per arrival)
MIX = [S, U, M, U, M, M,  # step 0: generation batches 0, 1, 2
       S, S, U, M, S, U]  # step 1: generation batches 0, 1, 2 -> cap
INFORMATIVE = [m is M for m in MIX]


def _write(path: Path, rewards: list[list[float]]) -> Path:
    with path.open("w") as fh:
        for i, r in enumerate(rewards):
            fh.write(json.dumps({"payload": {**prepare_toy.make_payload(i % 10), "rewards": r, "row": i}}) + "\n")
    return path


def _json(path: Path):
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dapo-mix")
    overrides = {
        "agent_runtime_arn": AGENT,
        "dataset_path": str(_write(tmp / "mix.jsonl", MIX)),
        "eval_dataset_path": str(_write(tmp / "mix_eval.jsonl", [S, S])),
        "batch_size": 2,
        "responses_per_prompt": 2,
        "max_num_gen_batches": 3,
        "max_prompts": 0,
        "eval_every": 0,  # only the final eval
        "eval_before_train": False,
        "save_every": -1,
        "acr_tps_limit": 16,
        "max_rollout_time": 60,
    }
    seen: dict = {}
    finish = run_module._finish

    def spy(stack, follower, desc, *args, **kwargs):  # keep what moto knows before it stops
        if follower is not None and stack.moto is not None:
            sfn = stack.moto.client("stepfunctions")
            seen["history"] = [e for arn in follower.executions for e in run_module._history(sfn, arn)]
        seen["description"] = desc
        return finish(stack, follower, desc, *args, **kwargs)

    # Handlers run in this process too (STEPWISE_LOCAL_WORKERS=0, or a call outside the workers): their
    # Powertools logger keeps the stream it was created with (in one pytest process, maybe an earlier
    # module's), so read its lines here as well as from logs/lambdas.log.
    from stepwise.handlers._common import logger

    lines: list[dict] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(json.loads(self.format(record)))

    keep = Keep()
    keep.setFormatter(logger.registered_formatter)
    logging.getLogger(logger._logger.name).addHandler(keep)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(run_module, "_finish", spy)
            result = run_local(CONFIG, run_id="dapo-mix", out_root=tmp, progress=False, overrides=overrides,
                               mirror_s3=True, timeout=300, quiet=True)
    finally:
        logging.getLogger(logger._logger.name).removeHandler(keep)
    result.execution = seen
    # run-local dispatches the handlers to worker processes by default (local/workers.py); their
    # lines reach the run folder's logs/lambdas.log, not this process's logger.
    log_file = result.run_dir / "logs" / "lambdas.log"
    for text in (log_file.read_text().splitlines() if log_file.exists() else []):
        try:
            line = json.loads(text)
        except ValueError:
            continue
        if isinstance(line, dict) and "message" in line and line not in lines:
            lines.append(line)
    result.log_lines = lines
    return result


def test_run_succeeds_with_the_cap_reason_in_the_execution_output(result):
    assert result.status == "SUCCEEDED", result.failure
    s3 = result.run_dir / "s3" / "runs" / "dapo-mix"
    state = _json(s3 / "state.json")
    reason = "max_num_gen_batches (3) reached at step 1 with 1/2 informative groups"
    assert state["stop_reason"] == reason and state["finished"] and state["session_stopped"]
    assert [c["reason"] for c in state["checkpoints"]] == ["final"]  # the cap path checkpoints
    assert result.simulator_counters.get("save_state") == 1
    assert result.session_status == "Stopped"
    out = json.loads(result.execution["description"]["output"])
    assert out["plan"] == {**out["plan"], "action": "finish", "reason": reason}
    assert any(x["message"].startswith("DAPO cap reached") and x["stop_reason"] == reason for x in result.log_lines)


def test_keeps_exactly_the_mixed_groups_in_the_predicted_generation_batches(result):
    s3 = result.run_dir / "s3" / "runs" / "dapo-mix"
    step0 = _json(s3 / "steps" / "0" / "summary.json")
    assert step0["decision"] == "train"
    assert step0["sampling/generation_batches"] == 3 and step0["sampling/kept_groups"] == 2
    assert step0["sampling/surplus_groups"] == 1
    assert step0["sampling/filtered_fraction"] == pytest.approx(3 / 6)  # S, U, U of the six groups
    assert step0["sampling/empty_rollouts"] == 0 and step0["sampler/num_rollouts"] == 12
    # the trained datums come from the first mixed group of gen1 and gen2 (gen2/p1 is the surplus)
    assert step0["sampler/num_datums"] == 4
    assert result.simulator_counters.get("optim_step") == 1

    step1 = _json(s3 / "steps" / "1" / "summary.json")
    assert step1["decision"] == "cap_reached"
    assert step1["sampling/generation_batches"] == 3 and step1["sampling/kept_groups"] == 1
    assert step1["sampling/filtered_fraction"] == pytest.approx(5 / 6)
    assert "step 1 with 1/2" in step1["stop_reason"]


def test_sampling_report_is_logged_and_emitted_as_metrics(result):
    logged = [x for x in result.log_lines if x.get("message") == "sampling"]
    assert [(x["step"], x["generation_batches"], x["kept_groups"], x["filtered_fraction"], x["decision"])
            for x in logged] == [(0, 3.0, 2.0, 0.5, "train"), (1, 3.0, 1.0, pytest.approx(5 / 6), "cap_reached")]
    emf = [json.loads(x) for x in (result.run_dir / "logs" / "lambdas.log").read_text().splitlines()
           if x.startswith("{") and "sampling/kept_groups" in x and "_aws" in x]
    assert [x["sampling/kept_groups"] for x in emf] == [[2.0], [1.0]]  # EMF values are lists
    assert all(x["run_id"] == "dapo-mix" and "sampling/filtered_fraction" in x for x in emf)


def test_each_generation_batch_draws_the_next_prompts_once(result):
    s3 = result.run_dir / "s3" / "runs" / "dapo-mix"
    rows = []
    for step in (0, 1):
        for g in range(3):
            items = _json(s3 / "steps" / str(step) / f"gen{g}" / "items.json")
            assert [(i["input_id"], i["member"]) for i in items] == [
                (f"s{step}g{g}p{p}", m) for p in range(2) for m in range(2)]
            rows.extend(sorted({i["row"] for i in items}))
            rollouts = list((s3 / "steps" / str(step) / f"gen{g}" / "rollouts").glob("*.json"))
            assert len(rollouts) == 4
            prompts = _json(s3 / "steps" / str(step) / f"gen{g}" / "prompts.json")
            assert [p["row"] for p in prompts.values()] == rows[-2:]
    assert rows == list(range(12))  # no prompt repeated or skipped
    assert not (s3 / "steps" / "0" / "gen3").exists() and not (s3 / "steps" / "2").exists()
    # one Distributed Map run per generation batch (6) plus the final eval's
    history = result.execution["history"]
    maps = [e for e in history if e["type"] == "MapStateEntered"
            and e["stateEnteredEventDetails"]["name"] == "Roll out generation batch"]
    assert len(maps) == 7


def test_final_eval_runs_after_the_cap(result):
    s3 = result.run_dir / "s3" / "runs" / "dapo-mix"
    evals = sorted((s3 / "evals").glob("*/summary.json"))
    assert len(evals) == 1
    ev = _json(evals[0])
    assert ev["final"] is True and ev["step"] == 1 and ev["eval/accuracy"] == 1.0 and ev["eval/n"] == 2
