"""The unmodified SDK against the simulator: the simulator's acceptance test."""

from __future__ import annotations

import torch

from local.agents import toy_task
from prepare_datasets import prepare_toy
from sagemaker.train.training_session import AdamParams, Datum, ModelInput, SamplingParams, TensorData



def _ce_datum(ids: list[int], prompt_len: int) -> Datum:
    inputs, targets = ids[:-1], ids[1:]
    weights = [0.0] * (prompt_len - 1) + [1.0] * (len(ids) - prompt_len)
    return Datum(
        model_input=ModelInput.from_ints(inputs),
        loss_fn_inputs={"target_tokens": TensorData(data=targets, dtype="int64"), "weights": TensorData(data=weights)},
    )


def _weights_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_sdk_trains_samples_saves_and_resumes(sim, svc):
    tc = svc.create_lora_training_client(base_model="stepwise-tiny")
    try:
        tok = tc.get_tokenizer()
        assert tok.eos_token == "<|im_end|>"
        batch = []
        for n in range(4):
            prompt = tok.apply_chat_template(toy_task.messages(prepare_toy.make_payload(n)), add_generation_prompt=True, tokenize=False)
            p_ids = tok.encode(prompt, add_special_tokens=False)
            full = tok.encode(prompt + f"The answer is {prepare_toy.answer_for(n)}.<|im_end|>", add_special_tokens=False)
            batch.append(_ce_datum(full, len(p_ids)))

        losses = []
        for _ in range(20):
            fb = tc.forward_backward(batch, loss_fn="cross_entropy")
            opt = tc.optim_step(AdamParams(learning_rate=5e-3))
            losses.append(fb.result().metrics["loss"])
            assert opt.result().metrics["learning_rate"] == 5e-3
        assert losses[-1] <= 0.5 * losses[0], losses
        assert sim.counters["optim_step"] >= 20

        sc = tc.save_weights_and_get_sampling_client()
        assert sc.model_package_arn.startswith("arn:aws:sagemaker:")
        resp = sc.sample(prompt_ids := tok.encode(
            tok.apply_chat_template(toy_task.messages(prepare_toy.make_payload(2)), add_generation_prompt=True, tokenize=False),
            add_special_tokens=False,
        ), num_samples=4, sampling_params=SamplingParams(max_tokens=512, temperature=1.0)).result()
        assert len(resp.sequences) == 4
        for seq in resp.sequences:
            assert len(seq.logprobs) == len(seq.tokens) > 0
            scored = sc.compute_logprobs(prompt_ids + seq.tokens).result()
            assert scored[0] is None and len(scored) == len(prompt_ids) + len(seq.tokens)
            diffs = [abs(a - b) for a, b in zip(seq.logprobs, scored[len(prompt_ids):])]
            assert max(diffs) < 1e-3, diffs

        ckpt = tc.save_state(description="resume test").result().model_package_arn
        saved_weights = sim.simulator.session_weights(tc.training_session_name)
        tc2 = svc.create_training_client_from_state_with_optimizer(ckpt)
        try:
            assert _weights_equal(sim.simulator.session_weights(tc2.training_session_name), saved_weights)
            # Optimizer state came along: the same next step on both sessions lands on the same weights.
            for client in (tc, tc2):
                client.forward_backward(batch, loss_fn="cross_entropy").result()
                client.optim_step(AdamParams(learning_rate=5e-3)).result()
            a = sim.simulator.session_weights(tc.training_session_name)
            b = sim.simulator.session_weights(tc2.training_session_name)
            assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
            assert not _weights_equal(a, saved_weights)
        finally:
            tc2.stop()
    finally:
        tc.stop()
    assert sim.running_sessions() == []
