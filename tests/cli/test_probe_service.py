"""`stepwise probe-service` against the simulator in each of its ``serving`` modes: it must tell them
apart, print the binding the rule picks (`stepwise.core.sampler_binding`) in a form the config accepts,
and stop its session on every path (its end, a failure, Ctrl-C)."""

from __future__ import annotations

import argparse
import json
import threading
import uuid
from typing import get_args

import pytest

from stepwise.config import RunConfig
from stepwise.core import sampler_binding as rules
from stepwise_cli.commands import probe_service
from tests.support.simulator import running_simulator

SERVINGS = ("several", "latest", "switching", "disturbing")
#: Sessions whose samples beside a training operation take this much longer (the others: no longer).
SLOWED = {"several": 1.5, "disturbing": 1.5}


@pytest.fixture(scope="module")
def sim():
    # a sample lasts 0.5 s, a load 0.3 s, a training operation 1 s: the probe's long samples span a load
    # and its samples run beside a training op, as on an account
    yield from running_simulator(sampling_workers=24, latency={"sample": 0.5, "load_weights_for_sampling": 0.3,
                                                               "forward_backward": 1.0})


def _args(sim, tmp_path, **over) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    probe_service.configure(parser)
    argv = ["--region", sim.region, "--role-arn", sim.role_arn, "--model-package-group-arn",
            sim.model_package_group_arn, "--s3-output-path", sim.s3_output_path, "--samples", "1",
            "--out", str(tmp_path / "probe.json")]
    for k, v in over.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    return parser.parse_args(argv)


def test_the_probe_tells_each_serving_mode_apart_and_prints_its_binding(sim, tmp_path, capsys):
    """One probe per serving mode, at once: the command itself against a simulator serving ``latest``, and
    three probes on sessions served in the other modes, two of whose samples slow beside a training op."""
    args = _args(sim, tmp_path)
    target = probe_service.resolve_target(args)
    results: dict[str, tuple] = {}

    def probe(serving: str) -> None:
        if serving == "latest":
            results[serving] = (probe_service.run(args), None)
            return
        name = f"stepwise-probe-{serving}-{uuid.uuid4().hex[:6]}"
        sim.set_serving(serving, session=name, contention_seconds=SLOWED.get(serving, 0.0))
        results[serving] = probe_service.run_probe(target, samples=1, say=lambda _: None, session_name=name)

    sim.set_serving("latest")
    try:
        threads = [threading.Thread(target=probe, args=(s,)) for s in SERVINGS]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=180)
    finally:
        sim.set_serving("several")
    out = capsys.readouterr().out
    code, _ = results["latest"]
    command = json.loads((tmp_path / "probe.json").read_text())
    assert code == 0 and command["complete"], out
    findings = {s: results[s][0] for s in SERVINGS if s != "latest"}
    findings["latest"] = probe_service.Findings(**{k: v for k, v in command.items() if k != "config"})
    for serving, f in findings.items():
        assert f.complete and f.behaviour == serving, (serving, f)
        assert f.recommended == rules.recommended_binding(serving)
        assert [x["package"] for x in f.loads] == ["A", "B", "A", "B"]
        assert f.across_load["spanning"] >= 1 and f.distinct_packages
        assert f.stopped and len(f.deleted_packages) == 2
        assert f.training["busy_s"], (serving, f.training)
    # sampling beside a training op: slowed where the session is made slow, and faster where it is not
    slowed = [findings[m].training for m in SLOWED]
    assert all(t["slowed"] for t in slowed), slowed
    assert max(findings[m].training["ratio"] for m in SERVINGS if m not in SLOWED) < min(t["ratio"] for t in slowed)
    # the command's last line is the config snippet, and the config accepts it
    snippet = json.loads(out.strip().splitlines()[-1])
    assert snippet == command["config"] == {"sampler_binding": "next_turn"}
    assert snippet["sampler_binding"] in get_args(RunConfig.model_fields["sampler_binding"].annotation)
    assert "loads: A" in out and "the service behaves: latest; safe: next_turn, turn_gate" in out
    assert sim.running_sessions() == []


def test_an_interrupted_probe_stops_its_session(sim, tmp_path, monkeypatch, capsys):
    """Ctrl-C while the probe waits on the service: the session it created is stopped before it exits."""
    seen = {}
    real_load = probe_service.Probe.load

    def interrupting_load(self, label, during="idle"):
        seen["session"] = self.findings.session
        assert self.findings.session in sim.running_sessions()
        raise KeyboardInterrupt

    monkeypatch.setattr(probe_service.Probe, "load", interrupting_load)
    code = probe_service.run(_args(sim, tmp_path))
    monkeypatch.setattr(probe_service.Probe, "load", real_load)
    out = capsys.readouterr().out
    assert code == 130 and "interrupted" in out
    assert json.loads(out.strip().splitlines()[-1]) == {"sampler_binding": "turn_gate"}  # nothing proven: the safe default
    assert seen["session"] not in sim.running_sessions() and sim.running_sessions() == []


def test_a_probe_that_cannot_create_its_session_reports_and_exits_1(sim, tmp_path, capsys):
    sim.set_session_start("fail")
    try:
        code = probe_service.run(_args(sim, tmp_path))
    finally:
        sim.set_session_start("ok")
    out = capsys.readouterr().out
    assert code == 1 and "incomplete" in out and sim.running_sessions() == []


def test_the_smallest_ungated_model_is_picked_by_its_size():
    from stepwise.core.preflight import HubModel

    def m(model_id, gated=False):
        return HubModel(name=model_id, arn="arn", model_id=model_id, version="1", display_name="", gated=gated,
                        hf_model_id=model_id)

    models = [m("meta-llama/Llama-3.2-1B-Instruct"), m("Qwen/Qwen3-0.6B"), m("google/gemma-3-270m", gated=True),
              m("HuggingFaceTB/SmolLM2-135M-Instruct"), m("some/unsized")]
    assert probe_service.smallest_model(models).model_id == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert probe_service.model_size("Qwen/Qwen3-0.6B") == 0.6 and probe_service.model_size("x/y") is None
    with pytest.raises(ValueError):
        probe_service.smallest_model([m("a/b-1B", gated=True)])
