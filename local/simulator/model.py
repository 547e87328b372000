"""The simulator's tiny model: a byte-level tokenizer and a small causal transformer.

* Tokenizer: 256 byte tokens (GPT-2 byte-to-unicode alphabet, no merges) plus the chat
  markers of the Qwen3 chat template shipped by ``trl`` (``trl/chat_templates/qwen3.jinja``),
  built with the ``tokenizers`` library and saved as a ``PreTrainedTokenizerFast`` directory,
  so ``AutoTokenizer.from_pretrained(<dir>)`` loads it and the toolkit's
  ``HfTemplateRenderer`` recognises the template by its hash (the toolkit's ``response_schemas``).
* Model: ``TinyLM``, a pre-norm decoder-only transformer with rotary position embeddings
  (Su et al. 2021, "RoFormer") and a KV cache for sampling.
* Training: ``attach_lora`` adds LoRA adapters (Hu et al. 2021, "LoRA", arXiv:2106.09685) of the
  session's ``LoraConfig`` rank and alpha to every projection, the unembedding included;
  ``merged_weights`` folds them back into plain ``TinyLM`` weights for sampling.

Shapes: ``B`` batch, ``T`` tokens, ``V`` vocabulary, ``D`` model width.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

#: Where the shipped tokenizer and base weights live (``STEPWISE_TINY_MODEL_DIR`` overrides,
#: for trying a rebuilt model before shipping it).
ASSETS_DIR = Path(os.environ.get("STEPWISE_TINY_MODEL_DIR") or Path(__file__).resolve().parent.parent / "assets" / "tiny-model")

#: Special (control) tokens; ``<|im_end|>`` is the end-of-turn / EOS token.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
#: Added, non-special tokens of the Qwen3 template: kept whole so they cost one position.
ADDED_TOKENS = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"


def qwen3_chat_template() -> str:
    """The Qwen3 chat template text exactly as ``trl`` ships it (its hash is registered
    in the toolkit's ``rollout_gateway/response_schemas.py``)."""
    import trl

    return (Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja").read_text()


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable-unicode map (the ByteLevel alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def build_tokenizer(out_dir: Path) -> None:
    """Write a byte-level ``PreTrainedTokenizerFast`` (ids 0..255 = bytes, then
    ``SPECIAL_TOKENS`` and ``ADDED_TOKENS``) with the Qwen3 chat template into ``out_dir``.
    Deterministic: the same files on every call."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = _bytes_to_unicode()
    vocab = {alphabet[b]: b for b in range(256)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        clean_up_tokenization_spaces=False,
        model_max_length=4096,
    )
    fast.chat_template = qwen3_chat_template()
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out_dir))


@dataclass(frozen=True)
class TinyConfig:
    """Architecture of ``TinyLM`` (saved as ``tiny_lm.json`` beside the weights; not ``config.json``, which ``AutoTokenizer`` would read as a transformers config)."""

    vocab_size: int = 272  # 256 bytes + 9 added tokens, rounded up to a multiple of 16
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 256
    max_context: int = 4096
    rope_base: float = 10000.0

    @classmethod
    def load(cls, path: Path) -> "TinyConfig":
        data = json.loads(path.read_text())
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})

    def to_json(self) -> str:
        return json.dumps({"model_type": "stepwise-tiny", **asdict(self)}, indent=2)


def _rope(x: torch.Tensor, offset: int, base: float) -> torch.Tensor:
    """Rotary embedding of ``x`` [B, H, T, Dh] for positions ``offset .. offset+T-1``."""
    _, _, t, dh = x.shape
    half = dh // 2
    inv_freq = base ** (-torch.arange(0, half, dtype=torch.float32) / half)
    pos = torch.arange(offset, offset + t, dtype=torch.float32)
    ang = torch.outer(pos, inv_freq)  # [T, half]
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class _Block(nn.Module):
    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.fc1 = nn.Linear(cfg.d_model, cfg.d_ff)
        self.fc2 = nn.Linear(cfg.d_ff, cfg.d_model)

    def forward(
        self, x: torch.Tensor, past: tuple[torch.Tensor, torch.Tensor] | None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        b, t, d = x.shape
        h = self.cfg.n_heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, h, d // h).transpose(1, 2) for z in (q, k, v))
        offset = 0 if past is None else past[0].shape[2]
        q = _rope(q, offset, self.cfg.rope_base)
        k = _rope(k, offset, self.cfg.rope_base)
        if past is not None:
            k = torch.cat([past[0], k], dim=2)
            v = torch.cat([past[1], v], dim=2)
        if past is None:
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            # New queries sit at the end of the cached keys: query i sees keys <= offset + i.
            total = k.shape[2]
            mask = torch.ones(t, total, dtype=torch.bool).tril(diagonal=offset)
            att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        x = x + self.fc2(F.gelu(self.fc1(self.ln2(x))))
        return x, (k, v)


class TinyLM(nn.Module):
    """Decoder-only LM. ``forward(ids [B,T], past) -> (logits [B,T,V], present)``."""

    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(
        self, ids: torch.Tensor, past: list | None = None
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        x = self.embed(ids)
        present = []
        for i, block in enumerate(self.blocks):
            x, kv = block(x, None if past is None else past[i])
            present.append(kv)
        return self.head(self.ln_f(x)), present


#: State-dict key infix of a parametrized (LoRA-adapted) weight.
_PARAMETRIZED = ".parametrizations.weight."


class LoRA(nn.Module):
    """Parametrization ``W -> W + (alpha / rank) * B @ A`` of one [out, in] weight (Hu et al. 2021).

    ``A`` [rank, in] starts as ``nn.Linear``'s own default (Kaiming-uniform, bound 1/sqrt(in))
    drawn from ``generator``; ``B`` [out, rank] starts at zero, so the adapted model computes
    exactly (bit for bit) the base model's outputs until the first optimizer step.
    """

    def __init__(self, out_features: int, in_features: int, rank: int, alpha: float, generator: torch.Generator) -> None:
        super().__init__()
        bound = 1.0 / math.sqrt(in_features)
        self.A = nn.Parameter(torch.empty(rank, in_features).uniform_(-bound, bound, generator=generator))
        self.B = nn.Parameter(torch.zeros(out_features, rank))
        self.register_buffer("scale", torch.tensor(alpha / rank))

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight + self.scale * (self.B @ self.A)


def attach_lora(model: TinyLM, rank: int, alpha: float, seed: int = 0) -> TinyLM:
    """Adapt every ``nn.Linear`` of ``model`` in place (attention qkv and output, both MLP
    matrices, the unembedding ``head``) with a ``LoRA`` of ``rank`` and ``alpha``; returns it.

    ``seed`` fixes every ``A`` (so two sessions with the same ``LoraConfig`` start identical,
    which seeded runs rely on). The adapted weights' originals keep ``requires_grad``; the
    trainer decides what trains.
    """
    from torch.nn.utils import parametrize

    generator = torch.Generator().manual_seed(seed)
    for _, module in sorted(model.named_modules()):
        if isinstance(module, nn.Linear):
            lora = LoRA(module.out_features, module.in_features, rank, alpha, generator)
            parametrize.register_parametrization(module, "weight", lora)
    return model


def is_lora_weights(weights: dict[str, torch.Tensor]) -> bool:
    """Whether a state dict comes from an ``attach_lora`` model."""
    return any(_PARAMETRIZED in k for k in weights)


def lora_rank(weights: dict[str, torch.Tensor]) -> int | None:
    """The LoRA rank of an adapted state dict (None for plain weights)."""
    for k, v in weights.items():
        if k.endswith(_PARAMETRIZED + "0.A"):
            return int(v.shape[0])
    return None


def merged_weights(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Plain ``TinyLM`` weights of an adapted state dict: ``W + scale * B @ A`` per adapted
    weight (the very expression ``LoRA.forward`` computes, so the same floats); plain weights
    are returned as they are."""
    out: dict[str, torch.Tensor] = {}
    for key, value in weights.items():
        if _PARAMETRIZED not in key:
            out[key] = value
            continue
        prefix, member = key.split(_PARAMETRIZED)
        if member == "original":
            lora = {m: weights[f"{prefix}{_PARAMETRIZED}0.{m}"] for m in ("A", "B", "scale")}
            out[f"{prefix}.weight"] = value + lora["scale"] * (lora["B"] @ lora["A"])
    return out


def load_base_model(assets_dir: Path = ASSETS_DIR) -> TinyLM:
    """Load the shipped base weights (``model.safetensors`` + ``tiny_lm.json``)."""
    from safetensors.torch import load_file

    cfg = TinyConfig.load(assets_dir / "tiny_lm.json")
    model = TinyLM(cfg)
    model.load_state_dict(load_file(str(assets_dir / "model.safetensors")))
    model.eval()
    return model


def save_model(model: TinyLM, assets_dir: Path) -> None:
    from safetensors.torch import save_file

    assets_dir.mkdir(parents=True, exist_ok=True)
    (assets_dir / "tiny_lm.json").write_text(model.cfg.to_json())
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(assets_dir / "model.safetensors"))


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def estimated_flops(model: TinyLM, tokens: int) -> float:
    """Training FLOPs estimate: 6 * parameters * tokens (Kaplan et al. 2020)."""
    return 6.0 * param_count(model) * tokens


__all__ = [
    "ASSETS_DIR",
    "EOS_TOKEN",
    "TinyConfig",
    "TinyLM",
    "LoRA",
    "attach_lora",
    "merged_weights",
    "build_tokenizer",
    "load_base_model",
    "save_model",
    "qwen3_chat_template",
    "estimated_flops",
]
