"""The one run follower of `stepwise watch` and `stepwise run-local` (`stepwise_cli.follow`), against moto."""

from __future__ import annotations

import json

from tests.support.cli import run_state, wait_status

from stepwise import layout
from stepwise.executions import continuation_name
from stepwise.stackinfo import StackInfo
from stepwise_cli.commands._runs import Deployment
from stepwise_cli.follow import RunFollower


def _deployment(moto_dep) -> Deployment:
    return Deployment(StackInfo(bucket=moto_dep.bucket, state_machine_arn=moto_dep.state_machine_arn),
                      moto_dep.sfn, moto_dep.s3)


def test_probing_finds_new_steps_without_listing_them_and_rereads_a_summary_extended_later(moto_dep):
    listed: list[str] = []
    moto_dep.s3.meta.events.register("provide-client-params.s3.ListObjectsV2",
                                     lambda params, **_: listed.append(params["Prefix"]))
    for step in (0, 1):
        moto_dep.put_json(layout.step_summary_key("r", "steps", step), {"sampler/mean_reward": step / 4})
    follower = RunFollower(_deployment(moto_dep), "r", probe_steps=True)
    assert follower.refresh() == [("steps", 0), ("steps", 1)]
    assert listed and not [p for p in listed if p == layout.summaries_prefix("r", "steps")]  # evals/ only

    # train metrics merged into step 1's summary after its first write, and step 2 appears
    moto_dep.put_json(layout.step_summary_key("r", "steps", 1), {"sampler/mean_reward": 0.25, "time/train": 2.0})
    moto_dep.put_json(layout.step_summary_key("r", "steps", 2), {"sampler/mean_reward": 0.5})
    assert follower.refresh() == [("steps", 1), ("steps", 2)]
    assert follower.cache.steps[1] == {"sampler/mean_reward": 0.25, "time/train": 2.0}
    assert follower.refresh() == []  # nothing changed: nothing re-read into the cache

    listed.clear()
    moto_dep.put_json(layout.step_summary_key("r", "evals", 3), {"eval/accuracy": 1.0})
    assert follower.refresh(full=True) == [("evals", 3)]
    assert layout.summaries_prefix("r", "steps") in listed  # at the end, steps/ is listed too


def test_the_run_ends_when_its_newest_execution_ends_without_handing_over(moto_dep):
    dep = _deployment(moto_dep)
    first = moto_dep.sfn.start_execution(stateMachineArn=dep.state_machine_arn, name="r",
                                         input=json.dumps({"wait": 1}))["executionArn"]
    moto_dep.put_json(layout.state_key("r"), run_state("r", first))  # not finished: a hand-over may follow
    follower = RunFollower(dep, "r")
    assert not follower.ended(follower.describe_newest())  # still running
    done = wait_status(moto_dep.sfn, first, ("SUCCEEDED",))
    assert done["status"] == "SUCCEEDED"

    second = moto_dep.sfn.start_execution(stateMachineArn=dep.state_machine_arn, name=continuation_name("r", 1),
                                          input=json.dumps({"wait": 60}))["executionArn"]
    assert not follower.ended(done)  # it handed over to its continuation, which is the run's newest now
    newest = follower.describe_newest()
    assert newest["executionArn"] == second and not follower.ended(newest)
    assert follower.executions == [first, second]

    moto_dep.sfn.stop_execution(executionArn=second, error="Stopped", cause="test")
    stopped = wait_status(moto_dep.sfn, second, ("ABORTED",))
    assert follower.ended(stopped)  # an abnormal end hands over to nothing

    moto_dep.put_json(layout.state_key("r"), run_state("r", second, finished=True))
    assert RunFollower(dep, "r").ended(done) is True  # finished: no hand-over to wait for
