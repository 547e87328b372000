"""What a turn samples while the training session loads new weights, and which choice is safe (pure).

Rebind makes new weights servable with the runtime's ``loadWeightsForSampling`` (the SDK's
``save_weights_and_get_sampling_client`` = ``saveWeights`` + ``loadWeightsForSampling``). What the
service then does with samples that name an *older* model package is not documented: botocore's
``SampleConfig.modelPackageArn`` says only that a sample without one runs on "the session's latest
checkpoint", and the SDK's ``SamplingClient`` that ``""`` is the base model. A run's ``sampler_binding``
(`stepwise.config.RunConfig`) says what the pipeline assumes, one of `BINDINGS`:

``per_rollout``
    Every turn of a rollout samples the package its rollout started with (its gateway session
    record's). Assumes the service keeps serving an older package after it loaded a newer one
    (it serves several at once), and that a load leaves samples in flight alone.
``next_turn``
    A turn samples the run's current sampler (`stepwise.records.RunSampler`, which Rebind rewrites
    around each load): a rollout moves to the new package at its next turn. Assumes a load leaves
    samples in flight alone, and that a sample naming the older package after the load is either
    still served by it or refused (the gateway then retries the turn on the newer package).
``turn_gate`` (the default)
    Rebind closes the run's gate; the gateway holds new turns and lets the turns in flight finish;
    the load runs with no sample in flight; Rebind reopens the gate and turns sample the new package.
    Assumes only that the package just loaded is served, at the price of a pause per load.

What a service may do (`BEHAVIOURS`; the simulator implements each, `stepwise probe-service` tells
them apart on an account): ``several`` (serves every package it loaded, loads disturb nothing),
``latest`` (serves only the package loaded last and refuses a sample naming another), ``switching``
(serves only the package loaded last and answers a sample naming another with it, silently),
``disturbing`` (a load changes samples in flight: their logprobs no longer belong to the package they
name, or they fail), ``unknown`` (not probed, or the probe could not tell).

Safe means: every turn is sampled by the package its captured turn records, and no load changes a
sample in flight (the datums' sampling logprobs are then the behaviour policy's, which the losses'
importance ratios need). `SAFE_BINDINGS` is that rule; `recommended_binding` picks the safe binding
that pauses least. The gate's own protocol (leases with deadlines, so a crashed gateway or Rebind
cannot hold it) is the rest of this module: the gateway asks `turn_sampler` and `gate_is_open`,
Rebind asks `close_gate`, `drain_verdict` and `open_gate`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from stepwise.records import RunSampler, SamplerPolicy

SamplerBinding = Literal["per_rollout", "next_turn", "turn_gate"]
#: In order of preference: the least pausing and the least mixing of policy versions in one rollout first.
BINDINGS: tuple[SamplerBinding, ...] = get_args(SamplerBinding)
DEFAULT_BINDING: SamplerBinding = "turn_gate"

ServiceBehaviour = Literal["several", "latest", "switching", "disturbing", "unknown"]
BEHAVIOURS: tuple[ServiceBehaviour, ...] = get_args(ServiceBehaviour)

#: Which bindings are safe against which behaviour of the service (see the module docstring).
SAFE_BINDINGS: dict[ServiceBehaviour, tuple[SamplerBinding, ...]] = {
    "several": ("per_rollout", "next_turn", "turn_gate"),
    "latest": ("next_turn", "turn_gate"),
    "switching": ("turn_gate",),
    "disturbing": ("turn_gate",),
    "unknown": ("turn_gate",),
}

#: What a sample naming the older package answered once the newer one was loaded: served by the older
#: package's weights, refused, answered by the newer package's weights, or by neither.
OlderAfterLoad = Literal["served", "refused", "switched", "garbage"]
#: What samples in flight while a load ran answered: the logprobs of the package they named, or not.
AcrossLoad = Literal["clean", "disturbed"]


def is_safe(binding: SamplerBinding, behaviour: ServiceBehaviour) -> bool:
    """Whether ``binding`` keeps every turn on the package it records against a service that behaves so."""
    return binding in SAFE_BINDINGS[behaviour]


def recommended_binding(behaviour: ServiceBehaviour) -> SamplerBinding:
    """The safe binding that pauses least (`BINDINGS` order): ``per_rollout`` for ``several``,
    ``next_turn`` for ``latest``, else ``turn_gate``."""
    return next(b for b in BINDINGS if is_safe(b, behaviour))


def classify_service(older_after_load: OlderAfterLoad | None, across_load: AcrossLoad | None) -> ServiceBehaviour:
    """The behaviour two observations of `stepwise probe-service` show (None = not observed).

    Args:
        older_after_load: what samples naming the older of two loaded packages answered after the
            newer one's load completed.
        across_load: what samples in flight while a load ran answered.

    A disturbed sample (or one matching neither package) makes the service ``disturbing`` whatever
    else was seen; otherwise both observations are needed, or the answer is ``unknown``.
    """
    if across_load == "disturbed" or older_after_load == "garbage":
        return "disturbing"
    if across_load is None or older_after_load is None:
        return "unknown"
    return {"served": "several", "refused": "latest", "switched": "switching"}[older_after_load]


# ---------------------------------------------------------------------------- the pipeline's choice


def rebind_during_rollouts(binding: SamplerBinding, max_staleness: int, admission: str = "batch") -> bool:
    """Whether Rebind loads the new weights while rollouts of the run are in flight.

    With ``max_staleness`` 0 every load happens between batches. With 1 (one Parallel state), the
    bindings that let a load overlap rollouts (``per_rollout``, ``next_turn``) rebind inside the
    training branch, so the next step does not wait for the load; ``turn_gate`` rebinds after the
    branches join, where no turn is in flight and the gate costs nothing (a gate closed inside the
    branch would pause the rollouts for as long as the load, which is no faster). Beyond 1, rollouts are
    always in flight (deep asynchrony): every binding loads during them, so the gateway must enforce it.
    So it is with ``admission: group`` (the group engine) from ``max_staleness`` 1: groups are admitted
    while a step trains and run through its Rebind. At 0 no group is admitted while a step trains, and
    the batch it trains was every group admitted (`stepwise.core.groups.admission_blocker`).
    """
    if max_staleness >= 2 or (admission == "group" and max_staleness >= 1):
        return True
    return max_staleness >= 1 and binding != "turn_gate"


def session_binding(binding: SamplerBinding, *, loads_during_rollouts: bool) -> SamplerBinding:
    """The binding the gateway enforces for a rollout (its session record's ``sampler_binding``).

    When no load can happen while the rollout runs, every binding samples the same package, and
    ``per_rollout`` does it with no request per turn; otherwise the run's ``binding``.
    """
    return binding if loads_during_rollouts else "per_rollout"


# ---------------------------------------------------------------------------- the gateway's side

#: A turn's lease on the gate lives this long unless the gateway renews it (every `LEASE_RENEW_SECONDS`
#: while the turn runs): a gateway that crashed mid-turn holds the gate at most this long.
LEASE_SECONDS = 60.0
LEASE_RENEW_SECONDS = 20.0
#: Clocks of the gateway and of Rebind may differ by this much; a lease counts as live this long past
#: its deadline.
CLOCK_SKEW_SECONDS = 5.0
#: A closed gate lives this long unless Rebind renews it (each Rebind call while the load runs): a run
#: whose execution died with its gate closed reopens by itself.
GATE_SECONDS = 120.0
#: Rebind loads after this long even if turns are still in flight (a turn that outlives it is counted
#: in the step's ``sampler/gate_turns_at_load``).
DRAIN_BOUND_SECONDS = 300.0
#: Rebind's wait between two looks at the leases while turns drain (the state machine's Wait).
DRAIN_POLL_SECONDS = 1
#: A held turn looks at the gate this often, and gives up (HTTP 503, the agent's client retries) after
#: `HOLD_LIMIT_SECONDS`.
HOLD_POLL_SECONDS = 0.5
HOLD_LIMIT_SECONDS = 600.0
#: ``next_turn``: how long a gateway container reuses the run's current sampler it read.
CURRENT_SAMPLER_MAX_AGE_SECONDS = 2.0


def turn_sampler(binding: SamplerBinding, record: SamplerPolicy, current: RunSampler | None) -> SamplerPolicy:
    """The sampler one turn samples with.

    ``per_rollout``: the session record's (``record``). Otherwise the run's current sampler when it is
    on the same training session and newer than the record's (a resumed run on a new session, or a
    rollout started after the last load, keeps its record's).
    """
    if binding == "per_rollout" or current is None:
        return record
    if current.training_session_name != record.training_session_name or current.policy_version <= record.policy_version:
        return record
    return SamplerPolicy(training_session_name=current.training_session_name,
                         sampler_model_package_arn=current.sampler_model_package_arn,
                         policy_version=current.policy_version)


def retry_sampler(tried: SamplerPolicy, current: RunSampler | None) -> SamplerPolicy | None:
    """``next_turn``: after the service refused a turn's sample, the sampler to retry it on, or None.

    The current sampler when it is newer than the one tried, else the package being loaded (a service
    that serves only the package loaded last refuses the older one from the moment the load ends, a
    little before Rebind rewrites the current sampler).
    """
    if current is None or current.training_session_name != tried.training_session_name:
        return None
    if current.policy_version > tried.policy_version:
        return turn_sampler("next_turn", tried, current)
    if current.loading_model_package_arn and current.loading_model_package_arn != tried.sampler_model_package_arn:
        return SamplerPolicy(training_session_name=current.training_session_name,
                             sampler_model_package_arn=current.loading_model_package_arn,
                             policy_version=current.loading_policy_version)
    return None


def gate_is_open(current: RunSampler | None, now: float) -> bool:
    """Whether a turn may sample now: no gate, an open one, or a closed one past its deadline."""
    return current is None or current.gate == "open" or now > current.gate_deadline


def lease_is_live(deadline: float, now: float) -> bool:
    """A turn lease holds the gate until its deadline (plus `CLOCK_SKEW_SECONDS`)."""
    return now <= deadline + CLOCK_SKEW_SECONDS


# ---------------------------------------------------------------------------- Rebind's side


def close_gate(current: RunSampler | None, policy: SamplerPolicy, loading: SamplerPolicy, now: float) -> RunSampler:
    """The run's sampler with its gate closed for the load of ``loading`` (``policy``: what the run
    samples now). A gate already closed for the same load keeps its ``closed_at`` and gets a new deadline."""
    same = (current is not None and current.gate == "closed"
            and current.loading_model_package_arn == loading.sampler_model_package_arn
            and current.closed_at is not None and now <= current.gate_deadline)
    return RunSampler(**policy.model_dump(), gate="closed", closed_at=current.closed_at if same else now,
                      gate_deadline=now + GATE_SECONDS, loading_model_package_arn=loading.sampler_model_package_arn,
                      loading_policy_version=loading.policy_version,
                      turns_at_load=current.turns_at_load if same else None, updated_at=now)


def announce_load(policy: SamplerPolicy, loading: SamplerPolicy, now: float) -> RunSampler:
    """``next_turn``: the run's sampler, open, naming the package about to be loaded (`retry_sampler`)."""
    return RunSampler(**policy.model_dump(), loading_model_package_arn=loading.sampler_model_package_arn,
                      loading_policy_version=loading.policy_version, updated_at=now)


def open_gate(policy: SamplerPolicy, now: float, closed: RunSampler | None = None) -> RunSampler:
    """The run's sampler after a load: ``policy``, gate open; keeps what the closed gate recorded
    (``closed_at``, ``turns_at_load``) so the step can report it."""
    kept = {"closed_at": closed.closed_at, "turns_at_load": closed.turns_at_load} \
        if closed is not None and closed.gate == "closed" else {}
    return RunSampler(**policy.model_dump(), gate="open", opened_at=now, updated_at=now, **kept)


@dataclass(frozen=True)
class DrainVerdict:
    """Whether the load may start: ``ready`` when no lease is live or the drain passed its bound;
    ``in_flight``: live leases (turns sampling now)."""

    ready: bool
    in_flight: int
    waited_s: float


def drain_verdict(closed_at: float, lease_deadlines: list[float], now: float,
                  bound_s: float = DRAIN_BOUND_SECONDS) -> DrainVerdict:
    """Rebind's look at the turn leases after closing the gate at ``closed_at`` (epoch seconds).

    Every turn takes its lease before it reads the gate (`stepwise.gateway.binding`), and S3 lists
    strongly consistently, so a turn that read the gate open before it closed has a lease in this
    listing, and one that reads it after sees it closed. Leases past their deadline are dead (a
    crashed gateway). Ready when none is live, or when ``bound_s`` passed since the gate closed.
    """
    live = sum(1 for d in lease_deadlines if lease_is_live(d, now))
    waited = max(0.0, now - closed_at)
    return DrainVerdict(ready=live == 0 or waited >= bound_s, in_flight=live, waited_s=waited)


def gate_metrics(sampler: RunSampler | None) -> dict[str, float]:
    """``time/gate_closed`` (seconds the gate was closed for the step's load) and
    ``sampler/gate_turns_at_load`` (turns still in flight when the load started: 0 unless the drain
    passed its bound) of an opened gate; ``{}`` when no gate closed."""
    if sampler is None or sampler.closed_at is None or sampler.opened_at is None:
        return {}
    return {"time/gate_closed": max(0.0, sampler.opened_at - sampler.closed_at),
            "sampler/gate_turns_at_load": float(sampler.turns_at_load or 0)}


# ---------------------------------------------------------------------------- what the probe observes

#: A greedy sample matches a reference when its first `MATCH_PREFIX` tokens are the reference's and its
#: logprobs there differ by less than this on average (numeric noise of a bf16 sampler is ~1e-3..1e-2).
MATCH_TOLERANCE = 0.1
MATCH_PREFIX = 16
#: A sample's logprobs are its package's when their mean distance to computeLogprobs of the same tokens
#: on that package is below this (a sampler and the logprob path may differ by bf16 noise).
LOGPROB_TOLERANCE = 0.1
#: Sampling counts as slowed by a training operation when it took this much longer than idle (ratio).
SLOWED_RATIO = 1.5


def sample_distance(tokens: list[int], logprobs: list[float], ref_tokens: list[int], ref_logprobs: list[float],
                    prefix: int = MATCH_PREFIX) -> float:
    """How far a greedy sample is from a reference greedy sample of the same prompt: the fraction of the
    first ``prefix`` tokens that differ plus the mean absolute logprob difference where they agree
    (0 = the same weights sampled it; inf when either is empty)."""
    n = min(prefix, len(tokens), len(ref_tokens))
    if n == 0:
        return float("inf")
    same = [i for i in range(n) if tokens[i] == ref_tokens[i]]
    if not same:
        return float("inf")
    return (n - len(same)) / n + sum(abs(logprobs[i] - ref_logprobs[i]) for i in same) / len(same)


def older_outcome(sample: tuple[list[int], list[float]] | None, older: tuple[list[int], list[float]],
                  newer: tuple[list[int], list[float]], tol: float = MATCH_TOLERANCE) -> OlderAfterLoad:
    """What one greedy sample naming the older package answered after the newer one was loaded
    (``sample`` None = refused): served by the older package's weights, by the newer's, or by neither."""
    if sample is None:
        return "refused"
    d_old, d_new = sample_distance(*sample, *older), sample_distance(*sample, *newer)
    if d_old <= tol and d_old <= d_new:
        return "served"
    if d_new <= tol:
        return "switched"
    return "garbage"


def summarize_older(outcomes: list[OlderAfterLoad]) -> OlderAfterLoad | None:
    """One answer for several samples: any garbage is garbage; otherwise the answer they all gave, or
    None when they disagree (or there were none)."""
    if "garbage" in outcomes:
        return "garbage"
    kinds = set(outcomes)
    return kinds.pop() if len(kinds) == 1 else None


def logprob_distance(returned: list[float], computed: list[float | None]) -> float:
    """Mean absolute difference between a sample's logprobs and computeLogprobs of the same tokens (inf
    when there is nothing to compare)."""
    pairs = [(a, b) for a, b in zip(returned, computed) if b is not None]
    if not pairs or len(returned) != len(computed):
        return float("inf")
    return sum(abs(a - b) for a, b in pairs) / len(pairs)


def summarize_across(distances: list[float | None], tol: float = LOGPROB_TOLERANCE) -> AcrossLoad | None:
    """What the samples that spanned a load answered (``None`` in the list = the sample failed):
    ``disturbed`` if any failed or carries logprobs that are not its package's, ``clean`` if all did,
    None when no sample spanned a load."""
    if not distances:
        return None
    return "disturbed" if any(d is None or d > tol for d in distances) else "clean"


def slowed_by_training(idle_s: list[float], busy_s: list[float], ratio: float = SLOWED_RATIO) -> tuple[float, bool]:
    """``(busy median / idle median, slowed)`` of sample latencies (seconds) measured idle and while a
    training operation ran."""
    import statistics

    if not idle_s or not busy_s:
        return float("nan"), False
    r = statistics.median(busy_s) / max(statistics.median(idle_s), 1e-9)
    return r, r >= ratio
