"""The simulator's tiny model really learns through the unmodified SDK: LoRA adapters of
the session's ``LoraConfig`` on every projection, the unembedding included, zero-initialised so
that an untrained session is the base model bit for bit."""

from __future__ import annotations

import math

import pytest
import torch

from local.simulator import TOY_RECIPE
from sagemaker.train.training_session import AdamParams, Datum, ModelInput, TensorData


#: One fixed 131-byte sentence; the datum is it three times over (403 target tokens).
SENTENCE = (
    "The quick brown fox jumps over the lazy dog, then naps in the warm afternoon sun "
    "while seven curious sparrows argue about breadcrumbs."
)


def _ce_datum(ids: list[int]) -> Datum:
    return Datum(
        model_input=ModelInput.from_ints(ids[:-1]),
        loss_fn_inputs={"target_tokens": TensorData(data=ids[1:], dtype="int64"), "weights": TensorData(data=[1.0] * (len(ids) - 1))},
    )


def _toy_lora_client(svc):
    return svc.create_lora_training_client(base_model="stepwise-tiny", rank=TOY_RECIPE["lora_rank"], alpha=TOY_RECIPE["lora_alpha"])


def test_cross_entropy_on_one_sequence_halves_its_loss_within_40_steps(sim, svc):
    # Before the LoRA adapters (frozen unembedding behind a LayerNorm) the loss plateaued at ~0.54 of
    # its first value, 5.2-5.5 nats per token (uniform over the bytes is ln 256 = 5.55), at every
    # learning rate from 1e-4 to 1e-2.
    tc = _toy_lora_client(svc)
    try:
        ids = tc.get_tokenizer().encode(" ".join([SENTENCE] * 3), add_special_tokens=False)
        datum = _ce_datum(ids)
        losses = []
        for step in range(41):
            losses.append(tc.forward_backward([datum], loss_fn="cross_entropy").result().metrics["loss:sum"])
            if step < 40:
                assert tc.optim_step(AdamParams(learning_rate=TOY_RECIPE["learning_rate"])).result().metrics["learning_rate"] == TOY_RECIPE["learning_rate"]
        per_token = losses[-1] / (len(ids) - 1)
        print(f"cross_entropy: first {losses[0]:.1f}, at 5/10/20/40 steps {[round(losses[k], 1) for k in (5, 10, 20, 40)]}, {per_token:.2f} nats/token")
        assert min(losses) <= 0.5 * losses[0], losses
        assert per_token < 0.75 * math.log(256), losses  # well below a uniform guess over the bytes
    finally:
        tc.stop()


def test_an_untrained_session_is_the_base_model_bit_for_bit_and_one_step_changes_it(sim, svc):
    tc = _toy_lora_client(svc)
    try:
        ids = tc.get_tokenizer().encode(SENTENCE, add_special_tokens=False)
        datum = _ce_datum(ids)
        base = tc.create_sampling_client().compute_logprobs(ids).result()[1:]
        # forward (no gradient) on the session's adapted model: the zero B matrices add exactly nothing.
        before = tc.forward([datum], loss_fn="cross_entropy").result().loss_fn_outputs[0]["logprobs"]["data"]
        assert before == base
        tc.forward_backward([datum], loss_fn="cross_entropy").result()
        tc.optim_step(AdamParams(learning_rate=1e-3)).result()
        after = tc.forward([datum], loss_fn="cross_entropy").result().loss_fn_outputs[0]["logprobs"]["data"]
        assert sum(after) > sum(before)
        # The sampler on the saved weights (merged adapters) scores the tokens as training does.
        trained = tc.save_weights_and_get_sampling_client().compute_logprobs(ids).result()[1:]
        assert trained == pytest.approx(after, abs=1e-4)
    finally:
        tc.stop()


def test_the_session_lora_rank_is_honoured_and_lora_plus_scales_b(sim, svc):
    small = svc.create_lora_training_client(base_model="stepwise-tiny", rank=4, alpha=8)
    try:
        weights = sim.simulator.session_weights(small.training_session_name)
        adapters_B = {k: v for k, v in weights.items() if k.endswith(".0.B")}
        assert adapters_B and all(v.shape[1] == 4 and not v.any() for v in adapters_B.values())
        assert any(k.startswith("head.") for k in adapters_B)  # the unembedding is adapted too
        ckpt = small.save_state().result().model_package_arn
        other = svc.create_lora_training_client(base_model="stepwise-tiny", rank=8, alpha=16)
        try:
            from sagemaker.train.training_session import OperationError

            with pytest.raises(OperationError, match="rank 4; this session's LoraConfig.Rank is 8"):
                other.load_state(ckpt).result()
        finally:
            other.stop()

        # loraPlusLrRatio: the same step with ratio 16 moves B further than with none.
        ids = small.get_tokenizer().encode(SENTENCE, add_special_tokens=False)
        moved = {}
        for ratio in (None, 16.0):
            small.load_state_with_optimizer(ckpt).result()
            small.forward_backward([_ce_datum(ids)], loss_fn="cross_entropy").result()
            small.optim_step(AdamParams(learning_rate=1e-3, lora_plus_lr_ratio=ratio)).result()
            w = sim.simulator.session_weights(small.training_session_name)
            moved[ratio] = sum(float(w[k].abs().sum()) for k in adapters_B)
        assert moved[16.0] > 4 * moved[None] > 0
    finally:
        small.stop()
    assert sim.running_sessions() == []


def test_sessions_with_the_same_lora_config_start_identical(sim, svc):
    a, b = _toy_lora_client(svc), _toy_lora_client(svc)
    try:
        wa = sim.simulator.session_weights(a.training_session_name)
        wb = sim.simulator.session_weights(b.training_session_name)
        assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    finally:
        a.stop()
        b.stop()
