"""What the simulated service *does* to a session's model: training and sampling operations.

Each function takes a parsed ``operationConfig`` member (wire names, as botocore models them)
and returns the matching ``operationResult`` member, exactly as the SDK parses it
(``types.py`` ``_from_api`` / ``sampling_client._parse_sample_result``). Errors are raised as
``OperationFailed`` (the operation ends ``Failed`` with that message in ``errorDetails``).
"""

from __future__ import annotations

import copy
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from local.simulator import losses
from local.simulator.model import TinyLM, attach_lora, estimated_flops, is_lora_weights, load_base_model, lora_rank, merged_weights


class OperationFailed(Exception):
    """An accepted operation that fails while running (status ``Failed``)."""


# ---------------------------------------------------------------- wire helpers


def model_input_tokens(model_input: dict[str, Any], vocab_size: int, what: str) -> list[int]:
    """Token ids of a ``ModelInput`` (``{"chunks": [{"tokens": [...], "type": "encoded_text"}]}``)."""
    tokens: list[int] = []
    for chunk in model_input.get("chunks") or []:
        tokens.extend(int(t) for t in chunk.get("tokens") or [])
    bad = [t for t in tokens if not 0 <= t < vocab_size]
    if bad:
        raise OperationFailed(f"{what}: token id {bad[0]} is outside the vocabulary [0, {vocab_size})")
    return tokens


def tensor_values(value: Any, key: str, index: int) -> list[float]:
    """Flat values of a ``TensorData`` (``{"data": [...], "dtype": ..., "shape": [...]}``)."""
    data = value.get("data") if isinstance(value, dict) else value
    if not isinstance(data, list):
        raise OperationFailed(f"datum[{index}].lossFnInputs[{key!r}].data must be a list of numbers")
    flat: list[float] = []

    def walk(x: Any) -> None:
        if isinstance(x, list):
            for y in x:
                walk(y)
        elif isinstance(x, (int, float)) and not isinstance(x, bool):
            flat.append(float(x))
        else:
            raise OperationFailed(f"datum[{index}].lossFnInputs[{key!r}] holds a non-number {x!r}")

    walk(data)
    return flat


def tensor_data(values: list[float], dtype: str = "float32") -> dict[str, Any]:
    return {"data": values, "dtype": dtype, "shape": [len(values)]}


# ---------------------------------------------------------------- training state


@dataclass
class ModelPackage:
    """A saved model package (``saveWeights`` -> kind model, ``saveState`` -> checkpoint)."""

    arn: str
    group_name: str
    group_arn: str
    version: int
    kind: str  # "model" | "checkpoint"
    description: str
    created: float
    base_model_name: str
    base_model_version: str
    s3_uri: str
    weights: dict[str, torch.Tensor]
    optimizer_state: dict[str, Any] | None = None


@dataclass
class TrainerState:
    """One session's trainable model, optimizer and gradient accumulator."""

    model: TinyLM
    optimizer: torch.optim.AdamW
    lock: threading.Lock = field(default_factory=threading.Lock)
    steps: int = 0
    pending_tokens: int = 0  # tokens accumulated since the last optimizer step

    @classmethod
    def from_base(cls, base: TinyLM, lora_rank: int = 8, lora_alpha: float = 16) -> "TrainerState":
        """A trainer on a copy of ``base`` with LoRA adapters of the session's ``LoraConfig``
        (``Rank``, ``Alpha``) on every projection (``model.attach_lora``)."""
        model = attach_lora(copy.deepcopy(base), lora_rank, lora_alpha)
        model.train()
        for name, param in model.named_parameters():
            param.requires_grad_(is_trainable(name))
        return cls(model=model, optimizer=_new_optimizer(model))


def is_trainable(param_name: str) -> bool:
    """Whether the service trains this parameter: the LoRA ``A`` and ``B`` of every adapted
    projection, the unembedding included (so the model can sharpen its output distribution
    over any token, which it could not with a frozen unembedding behind a LayerNorm); the
    adapted weights themselves, the embedding and the norms stay frozen, as a LoRA service
    leaves them. (Training the norms and biases too was measured: no faster on the
    cross-entropy probe, tests/simulator/test_learning.py.)"""
    return param_name.endswith((".0.A", ".0.B"))


def _is_lora_b(param_name: str) -> bool:
    return param_name.endswith(".0.B")


def _new_optimizer(model: TinyLM) -> torch.optim.AdamW:
    # Two groups so that loraPlusLrRatio can scale the B matrices' learning rate (LoRA+,
    # Hayou et al. 2024); lr/betas/eps/weight decay are set per step from AdamParamsConfig.
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return torch.optim.AdamW(
        [
            {"params": [p for n, p in named if not _is_lora_b(n)], "name": "A"},
            {"params": [p for n, p in named if _is_lora_b(n)], "name": "B"},
        ],
        lr=1e-4,
    )


def _datum_losses(
    state: TrainerState, loss_fn: str, datums: list[dict[str, Any]], loss_fn_config: dict | None
) -> tuple[torch.Tensor, list[losses.DatumLoss], int]:
    if loss_fn not in losses.LOSS_FNS:
        raise OperationFailed(f"lossFnName {loss_fn!r} is not one of {', '.join(losses.LOSS_FNS)}")
    try:
        clip = losses.clip_bounds(loss_fn, loss_fn_config)
    except ValueError as e:
        raise OperationFailed(str(e)) from None
    if not datums:
        raise OperationFailed("datumList is empty")
    vocab = state.model.cfg.vocab_size
    parsed: list[tuple[list[int], dict[str, list[float]]]] = []
    for i, datum in enumerate(datums):
        ids = model_input_tokens(datum.get("modelInput") or {}, vocab, f"datum[{i}].modelInput")
        if not ids:
            raise OperationFailed(f"datum[{i}].modelInput has no tokens")
        if len(ids) > state.model.cfg.max_context:
            raise OperationFailed(f"datum[{i}] has {len(ids)} tokens; the model's context is {state.model.cfg.max_context}")
        inputs = datum.get("lossFnInputs") or {}
        missing = [k for k in losses.REQUIRED_INPUTS[loss_fn] if k not in inputs]
        if missing:
            raise OperationFailed(f"datum[{i}]: loss function {loss_fn!r} requires lossFnInputs {', '.join(missing)}")
        cols = {k: tensor_values(inputs[k], k, i) for k in losses.REQUIRED_INPUTS[loss_fn]}
        for k, v in cols.items():
            if len(v) != len(ids):
                raise OperationFailed(f"datum[{i}]: lossFnInputs[{k!r}] has {len(v)} values but modelInput has {len(ids)} tokens")
        bad = [t for t in cols["target_tokens"] if not 0 <= int(t) < vocab]
        if bad:
            raise OperationFailed(f"datum[{i}]: target token {int(bad[0])} is outside the vocabulary [0, {vocab})")
        parsed.append((ids, cols))
    # One batched forward: right padding never changes a causal model's logits at real positions.
    width = max(len(ids) for ids, _ in parsed)
    batch_ids = torch.zeros(len(parsed), width, dtype=torch.long)
    batch_targets = torch.zeros(len(parsed), width, dtype=torch.long)
    for row, (ids, cols) in enumerate(parsed):
        batch_ids[row, : len(ids)] = torch.tensor(ids)
        batch_targets[row, : len(ids)] = torch.tensor([int(t) for t in cols["target_tokens"]])
    logits, _ = state.model(batch_ids)
    logp_BT = F.log_softmax(logits, dim=-1).gather(-1, batch_targets.unsqueeze(-1)).squeeze(-1)
    total = torch.zeros(())
    outs: list[losses.DatumLoss] = []
    tokens = 0
    for row, (ids, cols) in enumerate(parsed):
        dl = losses.datum_loss(
            loss_fn,
            logp_BT[row, : len(ids)],
            torch.tensor(cols["weights"]),
            torch.tensor(cols["logprobs"]) if "logprobs" in cols else None,
            torch.tensor(cols["advantages"]) if "advantages" in cols else None,
            clip,
        )
        total = total + dl.loss
        outs.append(dl)
        tokens += len(ids)
    return total, outs, tokens


def _fb_result(
    state: TrainerState, loss_fn: str, datums: list[dict[str, Any]], total: torch.Tensor, outs: list[losses.DatumLoss], tokens: int, elapsed: float
) -> dict[str, Any]:
    weights = []
    for d in datums:
        w = (d.get("lossFnInputs") or {}).get("weights")
        weights.append(sum(tensor_values(w, "weights", 0)) if w is not None else 0.0)
    weight_sum = sum(weights)
    loss_sum = float(total.detach())
    mask = [torch.tensor(tensor_values((d.get("lossFnInputs") or {})["weights"], "weights", 0)) != 0 for d in datums]
    n_active = sum(int(m.sum()) for m in mask)
    clipfrac = sum(float((o.clipped_T & m).sum()) for o, m in zip(outs, mask)) / max(n_active, 1)
    # k1 estimator of KL(sampler || policy) over weighted tokens (policy losses only).
    kl = 0.0
    if loss_fn != "cross_entropy":
        kl = sum(float(((-o.ratio_T.log()) * m).sum()) for o, m in zip(outs, mask)) / max(n_active, 1)
    flops = estimated_flops(state.model, tokens)
    metrics = {
        "loss": loss_sum / weight_sum if weight_sum else loss_sum,
        "loss:sum": loss_sum,
        "actor/pg_loss": loss_sum / max(len(datums), 1),
        "actor/pg_clipfrac": clipfrac,
        "actor/ppo_kl": kl,
        "global_token_num": float(tokens),
        "estimated_flops": flops,
        "promised_flops": 1e12,
        "mfu": flops / max(elapsed, 1e-9) / 1e12,
    }
    outputs = [
        {
            "logprobs": tensor_data([float(x) for x in o.logprobs_T.detach()]),
            "elementwise_loss": tensor_data([float(o.loss.detach())]),
        }
        for o in outs
    ]
    return {"lossFnOutputType": "per_datum", "lossFnOutputs": outputs, "metrics": metrics, "tokenUsage": {"trainingTokens": tokens}}


def forward_backward(state: TrainerState, config: dict[str, Any], *, backward: bool) -> dict[str, Any]:
    """``forwardBackward`` (accumulates gradients) or ``forward`` (no gradient)."""
    started = time.perf_counter()
    with state.lock:
        if backward:
            state.model.train()
            total, outs, tokens = _datum_losses(state, config["lossFnName"], config["datumList"], config.get("lossFnConfig"))
            total.backward()
            state.pending_tokens += tokens
        else:
            with torch.no_grad():
                total, outs, tokens = _datum_losses(state, config["lossFnName"], config["datumList"], config.get("lossFnConfig"))
        result = _fb_result(state, config["lossFnName"], config["datumList"], total, outs, tokens, time.perf_counter() - started)
        if backward:
            result["metrics"]["actor/grad_norm"] = _grad_norm(state.model)
    return result


def _grad_norm(model: TinyLM) -> float:
    norms = [p.grad.detach().norm() for p in model.parameters() if p.grad is not None]
    return float(torch.stack(norms).norm()) if norms else 0.0


def optimizer_step(state: TrainerState, config: dict[str, Any]) -> dict[str, Any]:
    """``optimizerStep``: AdamW over the gradients accumulated since the last step.

    ``AdamParamsConfig``: learningRate, beta1, beta2, eps, weightDecay (decoupled, AdamW as
    Loshchilov & Hutter 2019), gradClipNorm (global L2 norm clip before the step; 0 or absent
    = no clipping), loraPlusLrRatio (LoRA+: the B matrices step with ``learningRate *
    loraPlusLrRatio``, the A matrices with ``learningRate``; absent = 1). Gradients are zeroed
    after the step.
    """
    p = config["adamParamsConfig"]
    lr = float(p["learningRate"])
    b_ratio = float(p.get("loraPlusLrRatio") or 1.0)
    with state.lock:
        grad_norm = _grad_norm(state.model)
        clip = p.get("gradClipNorm")
        if clip:
            torch.nn.utils.clip_grad_norm_(state.model.parameters(), float(clip))
        for group in state.optimizer.param_groups:
            group["lr"] = lr * b_ratio if group.get("name") == "B" else lr
            group["betas"] = (float(p.get("beta1", 0.9)), float(p.get("beta2", 0.999)))
            group["eps"] = float(p.get("eps", 1e-8))
            group["weight_decay"] = float(p.get("weightDecay", 0.0))
        state.optimizer.step()
        state.optimizer.zero_grad(set_to_none=True)
        state.steps += 1
        tokens, state.pending_tokens = state.pending_tokens, 0
    return {"metrics": {"learning_rate": lr, "grad_norm": grad_norm, "optimizer_step": float(state.steps), "tokens": float(tokens)}}


def snapshot_weights(state: TrainerState) -> dict[str, torch.Tensor]:
    with state.lock:
        return {k: v.detach().clone() for k, v in state.model.state_dict().items()}


def snapshot_optimizer(state: TrainerState) -> dict[str, Any]:
    with state.lock:
        return copy.deepcopy(state.optimizer.state_dict()) | {"_steps": state.steps}


def load_state(state: TrainerState, package: ModelPackage, load_optimizer: bool) -> None:
    """``loadState``: restore weights (and optimizer state if asked); clears accumulated gradients."""
    if load_optimizer and package.optimizer_state is None:
        raise OperationFailed(
            f"model package {package.arn} is a {package.kind} package with no optimizer state; "
            "load it with loadOptimizer=false, or load a saveState checkpoint"
        )
    rank, wanted = lora_rank(package.weights), lora_rank(dict(state.model.state_dict()))
    if not is_lora_weights(package.weights) or rank != wanted:
        raise OperationFailed(
            f"model package {package.arn} holds LoRA weights of rank {rank}; this session's LoraConfig.Rank is {wanted}"
        )
    with state.lock:
        state.model.load_state_dict(package.weights)
        state.optimizer = _new_optimizer(state.model)
        state.optimizer.zero_grad(set_to_none=True)
        state.pending_tokens = 0
        if load_optimizer:
            opt_state = dict(package.optimizer_state or {})
            state.steps = int(opt_state.pop("_steps", 0))
            state.optimizer.load_state_dict(copy.deepcopy(opt_state))
        else:
            state.steps = 0


# ---------------------------------------------------------------- sampling


class Sampler:
    """An eval-mode copy of some weights, used by sampling operations (thread-safe)."""

    def __init__(self, model: TinyLM, eos_ids: list[int], decode) -> None:
        self.model = model.eval()
        self.eos_ids = set(eos_ids)
        self.decode = decode
        self.lock = threading.Lock()

    @classmethod
    def from_weights(cls, base: TinyLM, weights: dict[str, torch.Tensor] | None, eos_ids: list[int], decode) -> "Sampler":
        model = copy.deepcopy(base)
        if weights is not None:
            # Sampling runs the plain model on merged weights: the adapters cost it nothing.
            model.load_state_dict(merged_weights(weights))
        return cls(model, eos_ids, decode)

    @torch.no_grad()
    def prompt_logprobs(self, ids: list[int]) -> list[float | None]:
        """``[None, log p(x_1|x_0), ...]``: one entry per prompt token (computeLogprobs)."""
        if len(ids) > self.model.cfg.max_context:
            raise OperationFailed(f"prompt has {len(ids)} tokens; the model's context is {self.model.cfg.max_context}")
        with self.lock:
            logits, _ = self.model(torch.tensor([ids]))
        logp = F.log_softmax(logits[0, :-1], dim=-1).gather(-1, torch.tensor(ids[1:]).unsqueeze(-1)).squeeze(-1)
        return [None] + [float(x) for x in logp]

    @torch.no_grad()
    def topk_prompt_logprobs(self, ids: list[int], k: int) -> list[list[dict[str, Any]]]:
        with self.lock:
            logits, _ = self.model(torch.tensor([ids]))
        logp = F.log_softmax(logits[0, :-1], dim=-1)
        vals, idx = logp.topk(min(k, logp.shape[-1]), dim=-1)
        return [[]] + [
            [{"tokenId": int(i), "logprob": float(v)} for v, i in zip(vrow, irow)] for vrow, irow in zip(vals, idx)
        ]

    @torch.no_grad()
    def sample(self, prompt: list[int], n: int, params: dict[str, Any]) -> list[dict[str, Any]]:
        """Generate ``n`` continuations of ``prompt``.

        ``SamplingParams``: maxTokens, temperature (0 = greedy; default 1), topK (<= 0 = off),
        topP, seed, stop (text sequences, matched on the decoded continuation; the tokens that
        complete a stop sequence are kept). Generation also stops at an end-of-turn token
        (kept, as the last token). ``logprobs`` are the model's own (temperature 1, unfiltered)
        logprobs of the chosen tokens, so they agree with computeLogprobs on the same tokens.
        ``stopReason`` is ``stop`` or ``length`` (maxTokens or the context limit reached).
        """
        max_ctx = self.model.cfg.max_context
        if len(prompt) >= max_ctx:
            raise OperationFailed(f"prompt has {len(prompt)} tokens; the model's context is {max_ctx}")
        max_new = min(int(params["maxTokens"]), max_ctx - len(prompt))
        temperature = float(params.get("temperature", 1.0) if params.get("temperature") is not None else 1.0)
        top_k = int(params.get("topK") or 0)
        top_p = float(params["topP"]) if params.get("topP") is not None else 1.0
        stops = [s for s in (params.get("stop") or []) if s]
        gen = torch.Generator()
        if params.get("seed") is not None:
            gen.manual_seed(int(params["seed"]))
        else:
            gen.seed()
        tokens: list[list[int]] = [[] for _ in range(n)]
        logprobs: list[list[float]] = [[] for _ in range(n)]
        reasons: list[str | None] = [None] * n
        with self.lock:
            logits, past = self.model(torch.tensor([prompt]))
            last = logits[:, -1].expand(n, -1)
            past = [(k.expand(n, -1, -1, -1), v.expand(n, -1, -1, -1)) for k, v in past]
            for _ in range(max_new):
                logp = F.log_softmax(last.float(), dim=-1)
                if temperature == 0:
                    nxt = logp.argmax(-1)
                else:
                    scores = logp / temperature
                    if top_k > 0:
                        kth = scores.topk(min(top_k, scores.shape[-1]), dim=-1).values[:, -1:]
                        scores = scores.masked_fill(scores < kth, -math.inf)
                    if top_p < 1.0:
                        sorted_scores, order = scores.sort(dim=-1, descending=True)
                        probs = sorted_scores.softmax(-1)
                        drop = probs.cumsum(-1) - probs > top_p
                        drop[:, 0] = False
                        sorted_scores = sorted_scores.masked_fill(drop, -math.inf)
                        scores = torch.full_like(scores, -math.inf).scatter(-1, order, sorted_scores)
                    nxt = torch.multinomial(scores.softmax(-1), 1, generator=gen).squeeze(-1)
                chosen = logp.gather(-1, nxt.unsqueeze(-1)).squeeze(-1)
                for i in range(n):
                    if reasons[i] is not None:
                        continue
                    tok = int(nxt[i])
                    tokens[i].append(tok)
                    logprobs[i].append(float(chosen[i]))
                    if tok in self.eos_ids:
                        reasons[i] = "stop"
                    elif stops and any(s in self.decode(tokens[i]) for s in stops):
                        reasons[i] = "stop"
                if all(r is not None for r in reasons):
                    break
                logits, past = self.model(nxt.unsqueeze(-1), past)
                last = logits[:, -1]
        return [
            {
                "stopReason": reasons[i] or "length",
                "tokens": tokens[i],
                "logprobs": logprobs[i],
                "tokenUsage": {"prefill": len(prompt), "decode": len(tokens[i])},
            }
            for i in range(n)
        ]


def base_model() -> TinyLM:
    return load_base_model()
