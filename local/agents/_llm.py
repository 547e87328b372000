"""What every example agent reads from ``_rollout``: the LLM endpoint and sampling params.

The pipeline's StartRollout sends ``_rollout = {exp_id, input_id, s3_bucket, base_url,
model_id, api_key, ...sampling params}`` (docs/agent-contract.md); ``api_key`` is the gateway
session id. Sampling params may come as a ``sampling_params`` dict or as top-level keys;
anything absent is left to the gateway's session defaults.
"""

from __future__ import annotations

from typing import Any

_SAMPLING_KEYS = ("temperature", "top_p", "max_tokens", "max_completion_tokens", "seed", "stop")


def llm_settings(payload: dict[str, Any]) -> tuple[dict[str, str], dict[str, Any]]:
    """``payload`` -> (OpenAI client kwargs {base_url, api_key}, {model, **sampling kwargs}).

    Raises:
        ValueError: ``_rollout`` is missing or lacks ``base_url`` / ``model_id``.
    """
    ro = payload.get("_rollout")
    if not isinstance(ro, dict):
        raise ValueError("payload has no _rollout dict (base_url, model_id, api_key) to call the LLM with")
    missing = [k for k in ("base_url", "model_id") if not ro.get(k)]
    if missing:
        raise ValueError(f"_rollout lacks {missing}; got keys {sorted(ro)}")
    sampling: dict[str, Any] = {}
    source = ro.get("sampling_params") if isinstance(ro.get("sampling_params"), dict) else ro
    for key in _SAMPLING_KEYS:
        if source.get(key) is not None:
            sampling[key] = source[key]
    if "max_tokens" not in sampling and source.get("max_new_tokens") is not None:
        sampling["max_tokens"] = source["max_new_tokens"]
    base_url = str(ro["base_url"]).rstrip("/")
    if not base_url.endswith("/v1"):
        base_url += "/v1"
    client = {"base_url": base_url, "api_key": str(ro.get("api_key") or "EMPTY")}
    return client, {"model": str(ro["model_id"]), **sampling}
