"""Bedrock emulator: the Converse API (``bedrock-runtime``) and the model lookups (``bedrock``) on loopback, with a
deterministic, scriptable judge behind them and fault modes, so the group judge's real botocore client code
(`stepwise.aws.bedrock`) runs in the local stack and the tests.

Wire format (botocore ``bedrock-runtime`` 2023-09-30 and ``bedrock`` 2023-04-20, rest-json):

- ``Converse``: ``POST /model/{modelId}/converse`` (the id URL-encoded in the path), body ``{messages, system,
  inferenceConfig, toolConfig}``; answer ``{output: {message: {role, content}}, stopReason, usage: {inputTokens,
  outputTokens, totalTokens}, metrics: {latencyMs}}``;
- ``GetFoundationModel``: ``GET /foundation-models/{modelIdentifier}`` -> ``{modelDetails}``;
- ``GetInferenceProfile``: ``GET /inference-profiles/{inferenceProfileIdentifier}`` -> the profile;
- errors: ``{"message": ...}`` with ``X-Amzn-ErrorType``: ThrottlingException (429), ServiceUnavailableException
  (503), AccessDeniedException (403), ResourceNotFoundException (404), ValidationException (400).

boto3 reaches it through ``AWS_ENDPOINT_URL_BEDROCK_RUNTIME`` and ``AWS_ENDPOINT_URL_BEDROCK`` (`BedrockEmulator.env`).

**What it hosts** (`HOSTED_MODELS`): a few real model ids with what Bedrock says of them: Amazon Nova Micro, Lite
and Pro (on demand, and through the ``us.``/``eu.``/``apac.``/``global.`` cross-Region inference profiles) and
Claude Haiku 4.5 (through inference profiles only: invoking its bare id is a ValidationException, as on
Bedrock). Like Bedrock behind the stack's IAM grant, Converse on a model outside ``allowed_model_ids`` (the
stack's ``STEPWISE_JUDGE_MODEL_IDS``; empty = nothing granted) is refused with AccessDeniedException before any
fault or answer.

**The judge** reads the request the group judge sends (`stepwise.core.judge.converse_request`): the rubric
(``<rubric>`` of the system prompt), the task (``<task>``), each attempt (``<attempt k>``) and the score range
(the tool schema's ``minimum``/``maximum``), and answers a ``record_scores`` tool call from a scorer
(`Scorer`: the attempts in, one ``(score, reason)`` each out). The default, `rubric_rules`, knows two rubrics:

- one that asks for "the right digit" or "the digit that comes after" (the toy task, examples/toy_judge.json):
  the task's "What digit comes after N?" gives the right digit (N + 1) mod 10; an attempt whose last reply names
  it and no other digit scores the maximum, one that names it among others 30% of the range, any other the
  minimum;
- one that says "longer" is better: scores rise with the attempt's length (the length-bias drills);

any other rubric gets the middle of the range for every attempt. ``error_rate`` (``STEPWISE_LOCAL_BEDROCK_ERROR_RATE``
in the local stack) makes the judge wrong on that fraction of attempts, deterministically by the task and the
attempt's text (the same attempt at the same task is always judged the same, as the cache assumes): the top and
bottom scores swap. Tests pass
their own scorer.

**Faults** (`Faults`, `BedrockEmulator.inject`; the local stack reads ``STEPWISE_LOCAL_BEDROCK_FAULTS``, e.g.
``throttle=3,malformed=1``): the next Converse calls are, in this order of kinds, ``throttle`` (429), ``unavailable``
(503), ``malformed`` (a text answer holding broken JSON and no tool call), ``out_of_range`` (a tool call with a
score above the range), ``missing_member`` (a tool call without the last attempt), ``duplicate_member`` (an attempt
scored twice), ``slow`` (the right answer after ``slow_seconds``).

**Tokens**: a token per `CHARS_PER_TOKEN` characters of the request's text (system, messages, tool schema) and of
the answer; ``counters`` sums them, and the answers' ``usage`` carries them (the ledger's figures in local runs).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any
from urllib.parse import unquote

from local.acr import signed_region

ERROR_TYPE_HEADER = "X-Amzn-ErrorType"
_STATUS = {"ThrottlingException": 429, "ServiceUnavailableException": 503, "AccessDeniedException": 403,
           "ResourceNotFoundException": 404, "ValidationException": 400}
CHARS_PER_TOKEN = 4
ENV_FAULTS = "STEPWISE_LOCAL_BEDROCK_FAULTS"
ENV_ERROR_RATE = "STEPWISE_LOCAL_BEDROCK_ERROR_RATE"
PROFILE_PREFIXES = ("us.", "eu.", "apac.", "global.")

#: model id -> (name, provider, inference types): what GetFoundationModel answers, and how Converse may call it.
HOSTED_MODELS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "amazon.nova-micro-v1:0": ("Nova Micro", "Amazon", ("ON_DEMAND", "INFERENCE_PROFILE")),
    "amazon.nova-lite-v1:0": ("Nova Lite", "Amazon", ("ON_DEMAND", "INFERENCE_PROFILE")),
    "amazon.nova-pro-v1:0": ("Nova Pro", "Amazon", ("ON_DEMAND", "INFERENCE_PROFILE")),
    "anthropic.claude-haiku-4-5-20251001-v1:0": ("Claude Haiku 4.5", "Anthropic", ("INFERENCE_PROFILE",)),
}


@dataclass
class Faults:
    """Counts of the next Converse calls to answer with a fault, each kind consumed in this order."""

    throttle: int = 0
    unavailable: int = 0
    malformed: int = 0
    out_of_range: int = 0
    missing_member: int = 0
    duplicate_member: int = 0
    slow: int = 0

    @classmethod
    def parse(cls, text: str) -> "Faults":
        """``"throttle=3,malformed=1"`` -> Faults (raises ValueError naming an unknown kind)."""
        out = cls()
        known = {f.name for f in fields(cls)}
        for part in filter(None, (p.strip() for p in text.split(","))):
            name, _, n = part.partition("=")
            if name not in known:
                raise ValueError(f"unknown Bedrock fault {name!r}; known: {sorted(known)}")
            setattr(out, name, getattr(out, name) + int(n or 1))
        return out


@dataclass
class JudgeCall:
    """What the emulator read of a judge request: the rubric, the task, the attempts' texts, the score range."""

    rubric: str
    task: str
    attempts: list[str]
    lo: float = 0.0
    hi: float = 10.0


#: A judge: the call in, one ``(score, reason)`` per attempt out (it may be wrong on purpose; faults come after).
Scorer = Callable[[JudgeCall], Sequence[tuple[float, str]]]


@dataclass
class BedrockCounters:
    """What the emulator answered, by outcome, and the tokens it counted."""

    converse: int = 0
    answered: int = 0
    throttled: int = 0
    unavailable: int = 0
    malformed: int = 0
    out_of_range: int = 0
    missing_member: int = 0
    duplicate_member: int = 0
    slow: int = 0
    access_denied: int = 0
    not_found: int = 0
    invalid_requests: int = 0
    lookups: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    by_model: dict[str, int] = field(default_factory=dict)


# ---------------------------------------------------------------------------- the judge


_TASK = re.compile(r"<task>\n?(.*?)\n?</task>", re.S)
_ATTEMPT = re.compile(r"<attempt (\d+)>\n?(.*?)\n?</attempt \1>", re.S)
_RUBRIC = re.compile(r"<rubric>\n?(.*?)\n?</rubric>", re.S)
_QUESTION = re.compile(r"What digit comes after (\d)\?")
_THINK = re.compile(r"<think>.*?</think>", re.S)


def last_reply(attempt: str) -> str:
    """The text of an attempt's last ``[assistant]`` message (its final answer), '' when it has none."""
    parts = attempt.split("[assistant]")
    if len(parts) < 2:
        return ""
    text = parts[-1].split("\n[", 1)[0]
    return _THINK.sub("", text.replace("<|im_end|>", "")).strip()


def next_digit(call: JudgeCall) -> list[tuple[float, str]]:
    """The toy task's rubric: the right digit is the one after the task's N; see the module doc."""
    m = _QUESTION.search(call.task) or _QUESTION.search("\n".join(call.attempts))
    if m is None:
        return [((call.lo + call.hi) / 2, "no toy question found in the task") for _ in call.attempts]
    right = str((int(m.group(1)) + 1) % 10)
    out = []
    for attempt in call.attempts:
        reply = last_reply(attempt)
        digits = re.findall(r"\d", reply)
        if digits == [right]:
            out.append((call.hi, f"names the right digit {right}"))
        elif right in digits:
            out.append((call.lo + 0.3 * (call.hi - call.lo), f"names {right} among other digits ({''.join(digits)[:8]})"))
        else:
            shown = reply[:20] or "nothing"
            out.append((call.lo, f"answers {shown!r}, not the digit {right}"))
    return out


def longer_is_better(call: JudgeCall) -> list[tuple[float, str]]:
    """Scores rising with the attempt's length (ties share a score): a judge with a length bias."""
    lengths = sorted(set(len(a) for a in call.attempts))
    step = (call.hi - call.lo) / max(1, len(lengths) - 1)
    return [(call.lo + step * lengths.index(len(a)), f"{len(a)} characters long") for a in call.attempts]


def rubric_rules(call: JudgeCall) -> list[tuple[float, str]]:
    """The default judge: the rule its rubric names (see the module doc)."""
    rubric = call.rubric.lower()
    if "right digit" in rubric or "digit that comes after" in rubric:
        return next_digit(call)
    if "longer" in rubric:
        return longer_is_better(call)
    return [((call.lo + call.hi) / 2, "the local judge has no rule for this rubric") for _ in call.attempts]


def _wrong(text: str, rate: float) -> bool:
    """Whether the erring judge errs on ``text``: a deterministic draw from its hash."""
    if rate <= 0:
        return False
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF < rate


def read_call(body: dict[str, Any]) -> JudgeCall:
    """The judge request's rubric, task, attempts and range (raises ValueError when it is not one)."""
    system = "\n".join(str(b.get("text", "")) for b in body.get("system") or [] if isinstance(b, dict))
    messages = body.get("messages") or []
    first = messages[0] if messages and isinstance(messages[0], dict) else {}
    text = "\n".join(str(b.get("text", "")) for b in first.get("content") or [] if isinstance(b, dict))
    attempts = [t for _, t in sorted(((int(k), t) for k, t in _ATTEMPT.findall(text)), key=lambda kt: kt[0])]
    if not attempts:
        raise ValueError("no <attempt k> in the first user message: not a group judge request")
    lo, hi = 0.0, 10.0
    for tool in (body.get("toolConfig") or {}).get("tools") or []:
        schema = ((tool.get("toolSpec") or {}).get("inputSchema") or {}).get("json") or {}
        score = (((schema.get("properties") or {}).get("scores") or {}).get("items") or {}).get("properties", {}).get("score", {})
        lo, hi = float(score.get("minimum", lo)), float(score.get("maximum", hi))
    rubric = _RUBRIC.search(system)
    task = _TASK.search(text)
    return JudgeCall(rubric=rubric.group(1) if rubric else system, task=task.group(1) if task else "",
                     attempts=attempts, lo=lo, hi=hi)


def _tokens(text: str) -> int:
    return max(1, math.ceil(len(text) / CHARS_PER_TOKEN))


# ---------------------------------------------------------------------------- the server


class BedrockEmulator:
    """Loopback Bedrock: Converse answered by a judge, the model lookups, IAM scoping and faults.

    Args:
        region: the stack's region (default ``AWS_REGION``, else us-east-1): profile ARNs are made in it.
        account: the account of the profile ARNs.
        allowed_model_ids: the stack's grant (``STEPWISE_JUDGE_MODEL_IDS``); empty = nothing may be invoked.
        scorer: the judge (default `rubric_rules`).
        error_rate: the fraction of attempts the judge gets wrong (see the module doc).
        faults: faults armed at start-up.
        slow_seconds: how long a ``slow`` answer takes.
    """

    def __init__(self, *, region: str | None = None, account: str = "123456789012",
                 allowed_model_ids: Sequence[str] = (), scorer: Scorer | None = None, error_rate: float = 0.0,
                 faults: Faults | None = None, slow_seconds: float = 2.0):
        self.region = region or os.environ.get("AWS_REGION") or "us-east-1"
        self.account = account
        self.allowed_model_ids = tuple(allowed_model_ids)
        self.scorer = scorer or rubric_rules
        self.error_rate = error_rate
        self.faults = faults or Faults()
        self.slow_seconds = slow_seconds
        self.counters = BedrockCounters()
        self.requests: list[dict[str, Any]] = []  # the last Converse bodies (tests read them)
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: Any = None
        self.url = ""

    @property
    def env(self) -> dict[str, str]:
        """The variables that point boto3's ``bedrock-runtime`` and ``bedrock`` clients at this emulator."""
        return {"AWS_ENDPOINT_URL_BEDROCK_RUNTIME": self.url, "AWS_ENDPOINT_URL_BEDROCK": self.url}

    def start(self) -> "BedrockEmulator":
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(ready,), name="bedrock-emulator", daemon=True)
        self._thread.start()
        if not ready.wait(30):
            raise RuntimeError("Bedrock emulator did not start")
        return self

    def _serve(self, ready: threading.Event) -> None:
        from aiohttp import web

        self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self._loop)
        app = web.Application(client_max_size=50 * 1024 * 1024)
        app.router.add_post("/model/{model_id:.+}/converse", self._converse)
        app.router.add_get("/foundation-models/{model_id:.+}", self._foundation_model)
        app.router.add_get("/inference-profiles/{profile_id:.+}", self._inference_profile)
        app.router.add_get("/_bedrock/state", self._state)

        async def setup() -> None:
            self._runner = web.AppRunner(app, access_log=None)
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]

        self._loop.run_until_complete(setup())
        ready.set()
        self._loop.run_forever()

    def stop(self) -> None:
        if self._loop is None:
            return
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(15)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(15)
        self._loop.close()
        self._loop = None

    def __enter__(self) -> "BedrockEmulator":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def inject(self, **counts: int) -> None:
        """Arm faults for the next Converse calls, e.g. ``inject(throttle=3)`` (see `Faults`)."""
        known = {f.name for f in fields(Faults)}
        if unknown := set(counts) - known:
            raise ValueError(f"unknown fault(s) {sorted(unknown)}; known: {sorted(known)}")
        with self._lock:
            for name, n in counts.items():
                setattr(self.faults, name, getattr(self.faults, name) + int(n))

    # ------------------------------------------------------------------ what exists, who may invoke

    def profile_arn(self, profile_id: str, region: str | None = None) -> str:
        return f"arn:aws:bedrock:{region or self.region}:{self.account}:inference-profile/{profile_id}"

    @staticmethod
    def split(model_id: str) -> tuple[str, str]:
        """``(kind, id)`` of a model id or ARN: kind ``model`` (a foundation model) or ``profile``."""
        if model_id.startswith("arn:"):
            kind = "profile" if ":inference-profile/" in model_id else ("model" if ":foundation-model/" in model_id
                                                                         else "other")
            return kind, model_id.rsplit("/", 1)[-1]
        return ("profile" if model_id.startswith(PROFILE_PREFIXES) else "model"), model_id

    def hosts(self, model_id: str) -> bool:
        kind, ident = self.split(model_id)
        if kind == "profile":
            base = ident.split(".", 1)[1] if "." in ident else ""
            return ident.startswith(PROFILE_PREFIXES) and base in HOSTED_MODELS
        return kind == "model" and ident in HOSTED_MODELS

    def may_invoke(self, model_id: str) -> bool:
        """Whether the stack's grant covers ``model_id`` (a granted profile or model by its id or its ARN)."""
        want = self.split(model_id)
        return any(self.split(granted) == want for granted in self.allowed_model_ids)

    # ------------------------------------------------------------------ request path

    @staticmethod
    def _error(kind: str, message: str) -> Any:
        from aiohttp import web

        return web.json_response({"message": message}, status=_STATUS[kind], headers={ERROR_TYPE_HEADER: kind})

    def _take_fault(self) -> str | None:
        with self._lock:
            for f in fields(Faults):
                if getattr(self.faults, f.name) > 0:
                    setattr(self.faults, f.name, getattr(self.faults, f.name) - 1)
                    return f.name
        return None

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            setattr(self.counters, name, getattr(self.counters, name) + n)

    async def _converse(self, request: Any) -> Any:
        from aiohttp import web

        model_id = unquote(request.match_info["model_id"])
        self._count("converse")
        with self._lock:
            self.counters.by_model[model_id] = self.counters.by_model.get(model_id, 0) + 1
        if not self.may_invoke(model_id):
            self._count("access_denied")
            return self._error("AccessDeniedException", f"User is not authorized to perform: bedrock:InvokeModel on "
                               f"resource: {model_id} (the stack grants {', '.join(self.allowed_model_ids) or 'no model'})")
        if not self.hosts(model_id):
            self._count("not_found")
            return self._error("ResourceNotFoundException", f"the local Bedrock emulator hosts no model {model_id!r}")
        kind, ident = self.split(model_id)
        if kind == "model" and "ON_DEMAND" not in HOSTED_MODELS[ident][2]:
            self._count("invalid_requests")
            return self._error("ValidationException", f"Invocation of model ID {ident} with on-demand throughput "
                               "isn't supported. Retry your request with the ID or ARN of an inference profile that "
                               "contains this model.")
        try:
            body = json.loads(await request.read() or b"{}")
            call = read_call(body)
        except (ValueError, TypeError, AttributeError) as e:
            self._count("invalid_requests")
            return self._error("ValidationException", f"not a request the local judge answers: {e}")
        with self._lock:
            self.requests = [*self.requests[-49:], body]
        fault = self._take_fault()
        if fault == "throttle":
            self._count("throttled")
            return self._error("ThrottlingException", "Too many requests, please wait before trying again (injected fault)")
        if fault == "unavailable":
            self._count("unavailable")
            return self._error("ServiceUnavailableException", "Bedrock is unavailable (injected fault)")
        if fault == "slow":
            self._count("slow")
            await asyncio.sleep(self.slow_seconds)
        t0 = time.monotonic()
        scores = [list(s) for s in self.scorer(call)]
        for k, attempt in enumerate(call.attempts):
            if _wrong(call.task + attempt, self.error_rate):  # the erring judge: top and bottom swap
                scores[k][0] = call.hi + call.lo - scores[k][0]
                scores[k][1] = f"(misjudged) {scores[k][1]}"
        entries: list[dict[str, Any]] = [{"attempt": k + 1, "score": s, "reason": r} for k, (s, r) in enumerate(scores)]
        if fault == "out_of_range":
            self._count("out_of_range")
            entries[0]["score"] = call.hi + 5
        elif fault == "missing_member":
            self._count("missing_member")
            entries = entries[:-1]
        elif fault == "duplicate_member":
            self._count("duplicate_member")
            entries = [*entries, dict(entries[0])]
        answer = json.dumps({"scores": entries})
        if fault == "malformed":
            self._count("malformed")
            content: list[dict[str, Any]] = [{"text": "Here are the scores: " + answer[: max(10, len(answer) // 2)]}]
            stop = "end_turn"
        else:
            name = (((body.get("toolConfig") or {}).get("toolChoice") or {}).get("tool") or {}).get("name", "record_scores")
            content = [{"toolUse": {"toolUseId": f"tooluse_{uuid.uuid4().hex[:22]}", "name": name,
                                    "input": {"scores": entries}}}]
            stop = "tool_use"
        tokens_in = _tokens(json.dumps(body.get("system", "")) + json.dumps(body.get("messages", []))
                            + json.dumps(body.get("toolConfig", {})))
        tokens_out = _tokens(json.dumps(content))
        self._count("answered")
        self._count("input_tokens", tokens_in)
        self._count("output_tokens", tokens_out)
        return web.json_response({
            "output": {"message": {"role": "assistant", "content": content}}, "stopReason": stop,
            "usage": {"inputTokens": tokens_in, "outputTokens": tokens_out, "totalTokens": tokens_in + tokens_out},
            "metrics": {"latencyMs": int((time.monotonic() - t0) * 1000)},
        })

    async def _foundation_model(self, request: Any) -> Any:
        from aiohttp import web

        self._count("lookups")
        kind, ident = self.split(unquote(request.match_info["model_id"]))
        region = signed_region(request.headers.get("Authorization", "")) or self.region
        if kind != "model" or ident not in HOSTED_MODELS:
            return self._error("ResourceNotFoundException", f"Could not find model {ident!r} in {region}")
        name, provider, kinds = HOSTED_MODELS[ident]
        return web.json_response({"modelDetails": {
            "modelArn": f"arn:aws:bedrock:{region}::foundation-model/{ident}", "modelId": ident, "modelName": name,
            "providerName": provider, "inputModalities": ["TEXT"], "outputModalities": ["TEXT"],
            "responseStreamingSupported": True, "customizationsSupported": [], "inferenceTypesSupported": list(kinds),
            "modelLifecycle": {"status": "ACTIVE"}}})

    async def _inference_profile(self, request: Any) -> Any:
        from aiohttp import web

        self._count("lookups")
        given = unquote(request.match_info["profile_id"])
        kind, ident = self.split(given)
        region = signed_region(request.headers.get("Authorization", "")) or self.region
        if kind != "profile" or not self.hosts(given):
            return self._error("ResourceNotFoundException", f"The specified inference profile {ident!r} does not exist")
        base = ident.split(".", 1)[1]
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        return web.json_response({
            "inferenceProfileName": f"{ident.split('.', 1)[0].upper()} {HOSTED_MODELS[base][0]}",
            "inferenceProfileArn": self.profile_arn(ident, region), "inferenceProfileId": ident,
            "models": [{"modelArn": f"arn:aws:bedrock:{region}::foundation-model/{base}"}],
            "status": "ACTIVE", "type": "SYSTEM_DEFINED", "createdAt": now, "updatedAt": now})

    async def _state(self, request: Any) -> Any:
        """``GET /_bedrock/state``: the counters, for other processes."""
        from aiohttp import web
        from dataclasses import asdict

        with self._lock:
            return web.json_response({"counters": asdict(self.counters)})


def from_env(env: dict[str, str] | None = None, **kwargs: Any) -> BedrockEmulator:
    """An emulator armed from the local stack's environment: the grant ``STEPWISE_JUDGE_MODEL_IDS``, the faults
    ``STEPWISE_LOCAL_BEDROCK_FAULTS`` and the judge's ``STEPWISE_LOCAL_BEDROCK_ERROR_RATE``."""
    env = dict(os.environ if env is None else env)
    from stepwise.settings import ENV_JUDGE_MODEL_IDS

    granted = tuple(v.strip() for v in env.get(ENV_JUDGE_MODEL_IDS, "").split(",") if v.strip())
    return BedrockEmulator(allowed_model_ids=granted, faults=Faults.parse(env.get(ENV_FAULTS, "")),
                           error_rate=float(env.get(ENV_ERROR_RATE) or 0.0), **kwargs)
