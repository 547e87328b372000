"""Gateway session records and captured-turn keys in the run bucket.

The session record ``sessions/{sid}.json`` (`stepwise.records.SessionRecord`) is written by
StartRollout and closed by FinishRollout; the gateway only reads it (format: ``docs/internals.md``,
"Gateway session record"). Captured turns live under ``runs/{run_id}/sessions/{sid}/turns/`` one object
each, so a turn cap and a sampled-token budget can be counted across any number of
gateway containers with a single listing.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import uuid
from dataclasses import dataclass
from typing import Any

from stepwise.layout import turns_prefix
from stepwise.records import SessionRecord

#: What a sid may look like before we spend an S3 call on it (StartRollout makes uuid4s;
#: anything key-safe up to 128 characters is accepted so other callers can open sessions).
_SID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")

#: ``{completed_at_ns:020d}-{uuid4 hex}-o{output_tokens}.json``; see :func:`turn_key`.
_TURN_NAME_RE = re.compile(r"^(?P<ns>\d{20})-(?P<uid>[0-9a-f]{32})(?:-o(?P<out>\d+))?\.json$")


@dataclass(frozen=True)
class TurnUsage:
    """What a session has consumed so far, counted from its persisted turns."""

    turns: int
    output_tokens: int


def is_plausible_sid(sid: str | None) -> bool:
    """True if ``sid`` is safe to use in an S3 key (and so worth looking up)."""
    return bool(sid) and _SID_RE.match(sid) is not None


#: The session record's field holding the SHA-256 (hex) of the rollout's api-key secret.
API_KEY_DIGEST_FIELD = "api_key_sha256"
#: Between the sid and the secret in an api key (neither a uuid4 nor a URL-safe token holds one).
_KEY_SEP = "."


def new_api_key(sid: str) -> tuple[str, str]:
    """``(api_key, digest)`` for a new rollout: the key is ``{sid}.{secret}`` with a fresh secret of 32
    random bytes (``secrets.token_urlsafe``, 43 characters); the digest (SHA-256 of the secret, hex) is
    what the session record keeps. The sid part only says which record to read: it appears in S3 keys
    and logs, so the sid alone opens nothing."""
    secret = secrets.token_urlsafe(32)
    return f"{sid}{_KEY_SEP}{secret}", _digest(secret)


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def split_api_key(key: str | None) -> tuple[str | None, str]:
    """``(sid, secret)`` of an api key ``{sid}.{secret}``; ``(key, "")`` for a key without a secret."""
    if not key:
        return None, ""
    sid, _, secret = key.partition(_KEY_SEP)
    return sid, secret


def key_matches(record: SessionRecord, secret: str) -> bool:
    """Whether ``secret`` is the rollout's (its SHA-256 equals the record's digest, compared in constant
    time with ``hmac.compare_digest``). A record without a digest matches nothing, nor does a secret that
    is not ASCII (ours are ``token_urlsafe``): aiohttp hands a header's non-UTF-8 bytes over as lone
    surrogates, which UTF-8 cannot encode, and that exception was a 500 instead of the 401."""
    digest = (record.model_extra or {}).get(API_KEY_DIGEST_FIELD)
    if not isinstance(digest, str) or not digest or not secret or not secret.isascii():
        return False
    return hmac.compare_digest(_digest(secret).encode(), digest.encode())


def sid_digest(sid: str) -> str:
    """A short, stable stand-in for a sid in logs: the sid is the agent's api key."""
    return hashlib.sha256(sid.encode()).hexdigest()[:12]


def turn_key(run_id: str, sid: str, *, completed_at_ns: int, output_tokens: int, uid: str | None = None) -> str:
    """S3 key of one captured turn.

    ``{completed_at_ns:020d}-{uuid4 hex}`` makes keys unique without coordination
    (concurrent sub-agent turns never overwrite each other) and sorts them in completion
    order; the ``-o{output_tokens}`` suffix lets one listing count the session's sampled
    tokens. The fixed-width prefix is unique, so the suffix never changes the order.
    """
    uid = uid or uuid.uuid4().hex
    return f"{turns_prefix(run_id, sid)}{completed_at_ns:020d}-{uid}-o{int(output_tokens)}.json"


def usage_from_keys(keys: list[str]) -> TurnUsage:
    """Count turns and sampled tokens from turn object keys (see :func:`turn_key`).

    Keys that are not turn objects are ignored; a turn key without the token suffix counts
    as a turn with zero tokens.
    """
    turns = 0
    tokens = 0
    for key in keys:
        m = _TURN_NAME_RE.match(key.rsplit("/", 1)[-1])
        if m is None:
            continue
        turns += 1
        tokens += int(m.group("out") or 0)
    return TurnUsage(turns=turns, output_tokens=tokens)


def last_completed_at(keys: list[str]) -> float | None:
    """Epoch seconds the newest of these turns completed (the ``completed_at_ns`` prefix of :func:`turn_key`),
    or None when none is a turn object: when the agent's last LLM call ended (the rollout's re-check)."""
    times = [int(m.group("ns")) for key in keys if (m := _TURN_NAME_RE.match(key.rsplit("/", 1)[-1])) is not None]
    return max(times) / 1e9 if times else None


def turn_index(usage: TurnUsage, body: dict[str, Any]) -> int:
    """The 0-based index of the turn a request asks for, for its sampler seed.

    The larger of the session's persisted turns (right for an agent that sends a fresh context
    each call) and the assistant messages already in the request (right for a linear history,
    even when the previous turn's object lands a few ms after a streaming client read its end,
    docs/internals.md). Sequential turns of one rollout so get 0, 1, 2, ... whatever the timing;
    concurrent sub-agent turns of one session may share an index.
    """
    messages = body.get("messages")
    prior = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant") \
        if isinstance(messages, list) else 0
    return max(usage.turns, prior)


def refusal(record: SessionRecord, *, sid: str, now: float, secret: str | None = None) -> str | None:
    """Why this session may not sample now (-> 401), or None if it is live. ``secret``: the api key's
    secret part (`split_api_key`), checked against the record's digest (`key_matches`); None skips
    that check (callers that authenticated otherwise)."""
    if record.sid != sid:
        return "session record does not belong to this key"
    if secret is not None and not key_matches(record, secret):
        return "invalid api key: send the key the rollout was given (_rollout.api_key), not the session id"
    if record.closed:
        return "session is closed"
    if record.deadline and now > record.deadline:
        return "session has expired"
    return None


def limit_exceeded(record: SessionRecord, usage: TurnUsage) -> str | None:
    """Why this session has used up its budget (-> 429), or None.

    Counted from persisted turns, so concurrent in-flight turns of one session can
    overshoot the cap by at most the number of turns in flight.
    """
    if record.max_turns and usage.turns >= record.max_turns:
        return f"session exceeded max_turns={record.max_turns}"
    if record.max_total_tokens and usage.output_tokens >= record.max_total_tokens:
        return f"session exceeded max_total_tokens={record.max_total_tokens} (sampled {usage.output_tokens})"
    return None
