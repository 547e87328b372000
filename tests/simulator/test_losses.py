"""The documented losses, per-token weights, gradient accumulation and AdamParams, checked
against hand computation through the runtime (raw boto3), on the tiny model."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch

from local.simulator import start_simulator

from tests.support.simulator import control_client, create_session, runtime_client, unique_name, wait_op

TOKENS = [257, 117, 115, 101, 114, 10, 51, 258, 10, 257, 97, 10]  # "<|im_start|>user\n3<|im_end|>\n<|im_start|>a\n"
TARGETS = TOKENS[1:] + [52]


def _tensor(values, dtype="float32"):
    return {"data": list(values), "dtype": dtype}


def _datum(weights, sampler_logprobs=None, advantages=None):
    inputs = {"target_tokens": _tensor(TARGETS, "int64"), "weights": _tensor(weights)}
    if sampler_logprobs is not None:
        inputs["logprobs"] = _tensor(sampler_logprobs)
        inputs["advantages"] = _tensor(advantages)
    return {"modelInput": {"chunks": [{"tokens": TOKENS, "type": "encoded_text"}]}, "lossFnInputs": inputs}


@pytest.fixture(scope="module")
def sim():
    handle = start_simulator(result_wait_seconds=2.0)
    yield handle
    handle.stop()


class Session:
    """A raw-runtime session that numbers its own training operations."""

    def __init__(self, sim, name):
        self.sim, self.name, self.rt, self.seq = sim, create_session(sim, name), runtime_client(sim), 0

    def run(self, config: dict) -> dict:
        self.seq += 1
        op = self.rt.execute_training_operation(
            trainingSessionName=self.name, sequenceNumber=self.seq, clientToken=f"t{self.seq}", operationConfig=config
        )
        resp = wait_op(self.rt, self.name, op["operationId"])
        assert resp["status"] == "Completed", resp
        return resp["operationResult"]

    def forward(self, loss_fn, datums, config=None, backward=False) -> dict:
        body = {"lossFnName": loss_fn, "datumList": datums}
        if config is not None:
            body["lossFnConfig"] = config
        key = "forwardBackward" if backward else "forward"
        return self.run({key: body})[key]

    def step(self, **adam) -> dict:
        return self.run({"optimizerStep": {"adamParamsConfig": {"learningRate": 1e-3, **adam}}})

    def weights(self):
        return self.sim.simulator.session_weights(self.name)

    def stop(self):
        control_client(self.sim).stop_training_session(TrainingSessionName=self.name)


@pytest.fixture()
def session(sim, request):
    s = Session(sim, unique_name(request.node.name))
    yield s
    s.stop()


def _policy_logprobs(session, weights):
    out = session.forward("cross_entropy", [_datum(weights)])
    return out["lossFnOutputs"][0]["logprobs"]["data"]


def test_cross_entropy_is_the_weighted_sum_of_target_nlls(session):
    w = [0.0] * 6 + [1.0, 0.5, 2.0, 0.0, 1.0, 1.0]
    out = session.forward("cross_entropy", [_datum(w)])
    lp = out["lossFnOutputs"][0]["logprobs"]["data"]
    assert len(lp) == len(TOKENS)
    assert out["metrics"]["loss:sum"] == pytest.approx(-sum(a * b for a, b in zip(w, lp)), rel=1e-5)
    assert out["metrics"]["loss"] == pytest.approx(out["metrics"]["loss:sum"] / sum(w), rel=1e-5)
    assert out["metrics"]["global_token_num"] == len(TOKENS)


@pytest.mark.parametrize("loss_fn", ["importance_sampling", "ppo", "cispo"])
def test_policy_losses_match_their_definitions_with_clip_thresholds(session, loss_fn):
    n = len(TOKENS)
    w = [0.0] * 6 + [1.0] * (n - 6)
    lp = _policy_logprobs(session, w)
    # Sampler logprobs chosen so the ratios straddle the clip range [0.9, 1.1].
    shifts = [0.0, 0.5, -0.5, 0.05, -0.05, 0.3, -0.3, 0.02, 0.6, -0.6, 0.0, 0.2]
    q = [a - s for a, s in zip(lp, shifts)]
    adv = [0.0] * 6 + [1.0, -1.0, 2.0, -0.5, 1.5, -2.0]
    lo, hi = 0.9, 1.1
    out = session.forward(loss_fn, [_datum(w, q, adv)], {"clip_low_threshold": lo, "clip_high_threshold": hi})
    expected = 0.0
    clipped = active = 0
    for wi, a, b, A in zip(w, lp, q, adv):
        r = math.exp(a - b)
        rc = min(max(r, lo), hi)
        if loss_fn == "importance_sampling":
            term = r * A
        elif loss_fn == "ppo":
            term = min(r * A, rc * A)
        else:
            term = rc * A * a
        expected -= wi * term
        if wi:
            active += 1
            clipped += int(r < lo or r > hi)
    assert out["metrics"]["loss:sum"] == pytest.approx(expected, rel=1e-4, abs=1e-5)
    assert out["metrics"]["actor/pg_clipfrac"] == pytest.approx(clipped / active)


def test_policy_loss_update_raises_the_logprob_of_positively_advantaged_tokens(session):
    n = len(TOKENS)
    w = [0.0] * (n - 1) + [1.0]
    lp_before = _policy_logprobs(session, w)
    adv = [0.0] * (n - 1) + [1.0]
    for _ in range(3):
        session.forward("cispo", [_datum(w, lp_before, adv)], backward=True)
        session.step(learningRate=1e-3, weightDecay=0.0)
    assert _policy_logprobs(session, w)[-1] > lp_before[-1] + 1e-3


def test_zero_weights_give_zero_loss_and_gradient_and_weight_decay_is_decoupled(session):
    zero = [0.0] * len(TOKENS)
    out = session.forward("cross_entropy", [_datum(zero)], backward=True)
    assert out["metrics"]["loss:sum"] == 0.0 and out["metrics"]["actor/grad_norm"] == 0.0
    before = session.weights()
    session.step(learningRate=0.01, weightDecay=1.0)
    after = session.weights()
    name = "blocks.0.qkv.parametrizations.weight.0.A"  # a trained LoRA matrix
    assert torch.allclose(after[name], before[name] * (1 - 0.01 * 1.0), atol=1e-7)
    for frozen in ("embed.weight", "blocks.0.qkv.parametrizations.weight.original"):  # as LoRA leaves them
        assert torch.equal(after[frozen], before[frozen])


def test_gradients_accumulate_across_forward_backward_calls_until_the_step(sim, request):
    w = [0.0] * 6 + [1.0] * 6
    w2 = [0.0] * 4 + [2.0] * 8
    a, b = Session(sim, "accumulate-split"), Session(sim, "accumulate-whole")
    try:
        a.forward("cross_entropy", [_datum(w)], backward=True)
        a.forward("cross_entropy", [_datum(w2)], backward=True)
        a.step()
        b.forward("cross_entropy", [_datum(w), _datum(w2)], backward=True)
        b.step()
        wa, wb = a.weights(), b.weights()
        assert all(torch.allclose(wa[k], wb[k], atol=1e-6) for k in wa)
        # The step consumed the gradient: a further step with no forward_backward changes nothing (weight decay 0).
        before = a.weights()
        a.step(weightDecay=0.0)
        assert all(torch.allclose(before[k], a.weights()[k], atol=1e-6) for k in before)
    finally:
        a.stop()
        b.stop()


def test_grad_clip_norm_bounds_the_update(sim):
    w = [1.0] * len(TOKENS)
    a, b = Session(sim, "clip-on"), Session(sim, "clip-off")
    try:
        base = a.weights()
        for s, clip in ((a, 1e-6), (b, None)):
            s.forward("cross_entropy", [_datum(w)], backward=True)
            extra = {"gradClipNorm": clip} if clip else {}
            metrics = s.step(learningRate=0.01, eps=0.01, weightDecay=0.0, **extra)["optimizerStep"]["metrics"]
            assert metrics["grad_norm"] > 1e-3  # reported before clipping
        delta_a = sum(float((a.weights()[k] - base[k]).norm()) for k in base)
        delta_b = sum(float((b.weights()[k] - base[k]).norm()) for k in base)
        assert delta_a < 0.01 * delta_b
    finally:
        a.stop()
        b.stop()


def test_unknown_loss_config_keys_and_missing_inputs_fail_the_operation(session):
    rt = session.rt
    session.seq += 1
    op = rt.execute_training_operation(
        trainingSessionName=session.name, sequenceNumber=session.seq, clientToken="bad-cfg",
        operationConfig={"forward": {"lossFnName": "ppo", "datumList": [_datum([1.0] * len(TOKENS))]}},
    )
    resp = wait_op(rt, session.name, op["operationId"])
    assert resp["status"] == "Failed" and "advantages" in resp["errorDetails"]
    session.seq += 1
    op = rt.execute_training_operation(
        trainingSessionName=session.name, sequenceNumber=session.seq, clientToken="bad-key",
        operationConfig={"forward": {"lossFnName": "cross_entropy", "datumList": [_datum([1.0] * len(TOKENS))],
                                     "lossFnConfig": {"clip_ratio": 0.2}}},
    )
    resp = wait_op(rt, session.name, op["operationId"])
    assert resp["status"] == "Failed" and "clip_ratio" in resp["errorDetails"]


# ---------------------------------------------------------------------------- deep asynchrony's loss


def _decoupled_ppo_gradient(logp_T: torch.Tensor, behaviour_T: torch.Tensor, advantages_T: torch.Tensor,
                            weights_T: torch.Tensor, cap: float, eps: float = 0.2) -> torch.Tensor:
    """AReaL's decoupled PPO objective (arXiv:2505.24298, eq. 5) with one optimizer step per batch: the
    proximal policy is the policy being updated (detached), so its clipped ratio is 1 at the point the
    gradient is taken; the behaviour weight pi_prox / pi_behaviour is truncated at ``cap``. Returns the
    gradient of the loss (the negated objective, summed over weighted tokens) w.r.t. ``logp_T``."""
    logp = logp_T.detach().clone().requires_grad_(True)
    prox = logp.detach()
    ratio = torch.exp(logp - prox)  # 1 here, with gradient
    behaviour_weight = torch.exp(prox - behaviour_T).clamp(max=cap)
    objective = behaviour_weight * torch.minimum(ratio * advantages_T, ratio.clamp(1 - eps, 1 + eps) * advantages_T)
    (-(weights_T * objective).sum()).backward()
    return logp.grad


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(-4, 0), st.floats(-3, 3), st.floats(-2, 2), st.sampled_from([0.0, 1.0])),
                min_size=1, max_size=24))
def test_cispo_0_2_is_the_decoupled_objective_with_one_optimizer_step(tokens):
    """The deep-async default (`stepwise.core.staleness.DEEP_ASYNC_LOSS`): the simulator's cispo with clip
    thresholds 0 and 2 has exactly the gradient of AReaL's decoupled objective truncated at 2, while
    importance_sampling's weight is unbounded."""
    from local.simulator.losses import datum_loss

    from stepwise.core.staleness import DEEP_ASYNC_LOSS

    loss_fn, lo, hi = DEEP_ASYNC_LOSS
    logp_T = torch.tensor([t[0] for t in tokens], dtype=torch.float64)
    behaviour_T = logp_T - torch.tensor([t[1] for t in tokens], dtype=torch.float64)  # log ratio in [-3, 3]
    advantages_T = torch.tensor([t[2] for t in tokens], dtype=torch.float64)
    weights_T = torch.tensor([t[3] for t in tokens], dtype=torch.float64)
    x = logp_T.clone().requires_grad_(True)
    datum_loss(loss_fn, x, weights_T, behaviour_T, advantages_T, (lo, hi)).loss.backward()
    expected = _decoupled_ppo_gradient(logp_T, behaviour_T, advantages_T, weights_T, cap=hi)
    assert torch.allclose(x.grad, expected, atol=1e-9)
    # untruncated importance sampling weights a token by the full ratio (up to e^3 here)
    y = logp_T.clone().requires_grad_(True)
    datum_loss("importance_sampling", y, weights_T, behaviour_T, advantages_T, (lo, hi)).loss.backward()
    assert torch.allclose(y.grad, -weights_T * advantages_T * torch.exp(logp_T - behaviour_T), atol=1e-9)
