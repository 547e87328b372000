"""Shared parts of the gateway tests (tests/gateway/, the gateway drills, the behaviour and seeding
tests): moto S3 on loopback, the tiny model's tokenizer cached for a run, session records,
scripted samplers, and the toolkit's in-process reference gateway."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3

from agentcore_rl_toolkit.rollout_gateway import BaseTrace, HfTemplateRenderer, TurnRecord
from stepwise.layout import session_key, tokenizer_prefix, turns_prefix

REPO = Path(__file__).resolve().parents[2]
TINY_MODEL = REPO / "local" / "assets" / "tiny-model"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
BUCKET = "stepwise-gateway-test"
REGION = "us-west-2"
CREDS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION}


class MotoS3:
    """moto's server on a loopback port, with the test bucket."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        for k, v in CREDS.items():
            os.environ.setdefault(k, v)
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        self.client = self.new_client()
        try:  # moto's state is per process: another module's server may have made it
            self.client.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION})
        except self.client.exceptions.BucketAlreadyOwnedByYou:
            pass

    def new_client(self) -> Any:
        return boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION,
                            aws_access_key_id="testing", aws_secret_access_key="testing")

    def stop(self) -> None:
        self._server.stop()


def load_tokenizer() -> Any:
    """The tiny model's tokenizer (byte-level, TRL's qwen3 chat template), as the gateway loads it."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TINY_MODEL))


def cache_tokenizer(s3: Any, run_id: str) -> None:
    """What Init does: the run's tokenizer files under runs/{run_id}/tokenizer/."""
    for name in TOKENIZER_FILES:
        s3.upload_file(str(TINY_MODEL / name), BUCKET, tokenizer_prefix(run_id) + name)


#: sid -> the api key `open_session` gave its session (``{sid}.{secret}``; the record keeps the digest).
API_KEYS: dict[str, str] = {}


def api_key(sid: str) -> str:
    """The api key of a session `open_session` opened; any other sid as it is (the gateway refuses it)."""
    return API_KEYS.get(sid, sid)


def open_session(s3: Any, run_id: str, *, sid: str | None = None, bucket: str = BUCKET, **fields: Any) -> tuple[str, dict]:
    """Write a session record as StartRollout does, with a fresh api key (`api_key` returns it), in ``bucket``;
    returns (sid, record)."""
    from stepwise.gateway.session import API_KEY_DIGEST_FIELD, new_api_key

    sid = sid or str(uuid.uuid4())
    key, digest = new_api_key(sid)
    API_KEYS[sid] = key
    record = {
        "sid": sid, "run_id": run_id, "step": 3, "generation_batch": 0, "kind": "train",
        "training_session_name": "ts-test",
        "sampler_model_package_arn": "arn:aws:sagemaker:us-west-2:1:model-package/p/3",
        "policy_version": 3, "region": REGION, "tokenizer_prefix": tokenizer_prefix(run_id),
        "sampling_defaults": {"max_new_tokens": 64, "temperature": 1.0},
        "max_context_tokens": 4096, "max_turns": 64, "max_total_tokens": 262144,
        "deadline": time.time() + 3600, "closed": False, API_KEY_DIGEST_FIELD: digest,
    }
    record.update(fields)
    s3.put_object(Bucket=bucket, Key=session_key(sid), Body=json.dumps(record).encode())
    return sid, record


def turn_objects(s3: Any, run_id: str, sid: str, *, expect: int = 0, timeout: float = 5.0) -> dict[str, dict]:
    """{key name: body} of a session's captured turns.

    ``expect``: wait up to ``timeout`` s for that many. A streamed turn is written after its
    last chunk and before the response ends, but clients that stop reading at the stream's
    end marker (the OpenAI client stops at ``[DONE]``) can return before the write lands;
    FinishRollout's grace period covers the same window.
    """
    prefix = turns_prefix(run_id, sid)
    deadline = time.monotonic() + timeout
    while True:
        contents = s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
        if len(contents) >= expect or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    out = {}
    for obj in contents:
        out[obj["Key"][len(prefix):]] = json.loads(s3.get_object(Bucket=BUCKET, Key=obj["Key"])["Body"].read())
    return out


@dataclass
class ScriptedSampler:
    """A sampling backend whose outputs are scripted text (the tiny model does not emit
    tool calls by itself). Each call takes the next script entry (``default`` when empty),
    appends the end-of-turn token, and gives deterministic logprobs. Injected through the
    same seam in our gateway and in the reference gateway."""

    tokenizer: Any
    script: list[str] = field(default_factory=list)
    default: str = "ok"
    calls: list[tuple[list[int], TurnRecord]] = field(default_factory=list)
    params: list[dict] = field(default_factory=list)
    delay: float = 0.0

    async def generate(self, *, prompt_ids, sampling_params, session_id=None, image_data=None, video_data=None):
        if self.delay:
            await asyncio.sleep(self.delay)
        text = self.script.pop(0) if self.script else self.default
        out = self.tokenizer.encode(text + "<|im_end|>", add_special_tokens=False)
        turn = TurnRecord(prompt_ids=list(prompt_ids), output_ids=out, finish_reason="stop",
                          output_log_probs=[-0.001 * (i + 1) for i in range(len(out))])
        self.calls.append((list(prompt_ids), turn))
        self.params.append(dict(sampling_params))
        return turn


@dataclass
class ReplaySampler:
    """Returns, for a prompt, the output another sampler produced for the same prompt ids:
    gives the reference gateway the very sampler outputs our gateway got (and fails if
    the reference rendered a prompt our gateway never sent)."""

    outputs: list[tuple[list[int], TurnRecord]]

    async def generate(self, *, prompt_ids, sampling_params, session_id=None, image_data=None, video_data=None):
        for i, (ids, turn) in enumerate(self.outputs):
            if ids == list(prompt_ids):
                self.outputs.pop(i)
                return turn
        raise AssertionError("reference gateway rendered a prompt our gateway did not sample")


class ReferenceGateway:
    """The toolkit's in-process RolloutGateway on a loopback thread (what train_grpo.py runs)."""

    def __init__(self, backend: Any, tokenizer: Any) -> None:
        from agentcore_rl_toolkit.rollout_gateway.gateway import RolloutGateway
        from agentcore_rl_toolkit.rollout_gateway.server import ThreadedGatewayServer

        self.gateway = RolloutGateway(backend=backend, renderer=HfTemplateRenderer(tokenizer), tokenizer=tokenizer,
                                      adapters=["openai", "anthropic"])
        self.server = ThreadedGatewayServer(self.gateway, host="127.0.0.1", port=0)
        self.server.start()
        self.url = f"http://127.0.0.1:{self.server.port}"

    def open(self, sid: str, record: dict) -> None:
        self.gateway.create_session(sid, sampling_defaults=record["sampling_defaults"],
                                    max_context_tokens=record["max_context_tokens"])

    def finish(self, sid: str, reward: float) -> list:
        coro = self.gateway.finish_session(sid, base_sample=BaseTrace(rollout_id=sid), reward=reward)
        return asyncio.run_coroutine_threadsafe(coro, self.server._loop).result(timeout=30)

    def stop(self) -> None:
        self.server.shutdown()


def serve_ours(s3: Any, factory: Any, *, bucket: str = BUCKET, **settings: Any) -> Any:
    """Our gateway app served on a loopback thread (on ``bucket``)."""
    from stepwise.gateway import start_gateway
    from stepwise.gateway.app import GatewaySettings, build_app

    app = build_app(GatewaySettings(bucket=bucket, **settings), s3=s3, sampler_factory=factory)
    return start_gateway(app=app)


def fixed_factory(backend: Any):
    """A sampler factory that hands every session the same backend."""
    return lambda record: backend


def scripted_gateway(run_id: str, sampler_cls: type = None, **settings: Any):
    """Generator for a module fixture: ``(s3, sampler, gateway)`` -- moto S3 with the run's tokenizer
    cached, a `ScriptedSampler` (or ``sampler_cls``) and our gateway serving every session from it
    (``settings``: more ``GatewaySettings`` fields, e.g. ``max_body_bytes``). Stops both when closed."""
    s3 = MotoS3()
    cache_tokenizer(s3.client, run_id)
    sampler = (sampler_cls or ScriptedSampler)(load_tokenizer())
    gw = serve_ours(s3.new_client(), fixed_factory(sampler), **settings)
    try:
        yield s3, sampler, gw
    finally:
        gw.stop()
        s3.stop()


__all__ = ["BUCKET", "MotoS3", "ReferenceGateway", "ReplaySampler", "ScriptedSampler", "api_key", "cache_tokenizer",
           "fixed_factory", "load_tokenizer", "open_session", "scripted_gateway", "serve_ours", "turn_objects"]
