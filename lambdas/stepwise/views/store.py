"""Reading a run's objects for a person: typed, through any store, with one error for a damaged file.

Reads through any *store* with ``get_json(key)``, ``get_json_or(key, default)``, ``get_bytes(key)`` and
``list_keys(prefix)``: the S3 run store (`stepwise.aws.runstore.RunStore`: the Track function, and the
CLI against a deployed stack) or a local run folder's copy of the bucket (`stepwise_cli.sources.DirStore`),
so both read a run the same way. Keys come from `stepwise.layout`; what the objects are from
`stepwise.records` (`RunState`, `RolloutRecord`) and `stepwise.config` (`RunConfig`): a view reads
the typed records the loop wrote, never a dict whose keys it guesses.

A file that is not what the loop writes (a hand-edited ``state.json``, a truncated ``config.json``) is
`Unreadable`, naming the file and what is wrong in one line; an absent optional file is None.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import ValidationError

from stepwise import layout
from stepwise.records import JudgeRecord, RolloutRecord, RunState

if TYPE_CHECKING:
    from stepwise.config import RunConfig
    from stepwise.views.steps import StepView

__all__ = ["READERS", "ConsumedGroups", "Store", "Tokenizer", "Unreadable", "consumed_groups", "find_rollout",
           "group_judgements", "group_records", "load_tokenizer", "read_config", "read_json", "read_many", "read_state",
           "read_view", "rollout_detail", "rollout_turns", "step_folder", "step_judgements", "step_records",
           "steps_with_rollouts", "waiting_groups", "where"]


class Store(Protocol):
    def get_json(self, key: str) -> Any: ...
    def get_json_or(self, key: str, default: Any = None) -> Any: ...
    def get_bytes(self, key: str) -> bytes: ...
    def list_keys(self, prefix: str) -> list[str]: ...


class Unreadable(ValueError):
    """A run's object is not what the loop writes (not JSON, or not its record's shape). The message is
    one line: the file (a local path or ``s3://bucket/key``) and what is wrong with it."""

    def __init__(self, location: str, problem: str) -> None:
        super().__init__(f"{location} is damaged: {problem}")
        self.location = location


#: Parallel reads of many small objects (rollout records, captured turns): S3 answers each in ~10-30 ms.
READERS = 16


def where(store: Any, key: str) -> str:
    """The object's location as a person finds it: a local path (a run folder's store) or ``s3://bucket/key``."""
    root = getattr(store, "root", None)
    if root is not None:
        return os.path.join(str(root), key)
    return f"s3://{getattr(store, 'bucket', '?')}/{key}"


def read_json(store: Store, key: str) -> Any:
    """The JSON at ``key``; None when absent. Raises `Unreadable` when it is not JSON."""
    try:
        body = store.get_bytes(key)
    except KeyError:
        return None
    try:
        return json.loads(body)
    except ValueError as e:
        raise Unreadable(where(store, key), f"not JSON ({e})") from None


def _problem(e: ValidationError) -> str:
    first = e.errors()[0] if e.errors() else {}
    loc = ".".join(str(p) for p in first.get("loc", ())) or "the object"
    more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
    return f"{loc}: {first.get('msg', str(e))}{more}"


def read_config(store: Store, run_id: str) -> RunConfig:
    """The run's ``config.json`` as a `RunConfig`. Raises `Unreadable` when it is absent, not JSON or
    not a valid config."""
    from stepwise.config import RunConfig

    key = layout.config_key(run_id)
    body = read_json(store, key)
    if body is None:
        raise Unreadable(where(store, key), "missing (Init writes it before anything else)")
    if not isinstance(body, Mapping):
        raise Unreadable(where(store, key), f"a JSON {type(body).__name__}, not a run config object")
    try:
        return RunConfig.model_validate(dict(body))
    except ValidationError as e:
        raise Unreadable(where(store, key), _problem(e)) from None


def read_state(store: Store, run_id: str) -> RunState | None:
    """The run's ``state.json`` as a `RunState`; None before Init wrote it. Raises `Unreadable`."""
    key = layout.state_key(run_id)
    body = read_json(store, key)
    if body is None:
        return None
    if not isinstance(body, Mapping):
        raise Unreadable(where(store, key), f"a JSON {type(body).__name__}, not a run state object")
    try:
        return RunState.model_validate(dict(body))
    except ValidationError as e:
        raise Unreadable(where(store, key), _problem(e)) from None


def read_many(store: Store, keys: list[str], *, readers: int = READERS) -> list[Any]:
    """``store.get_json`` of every key, in order, ``readers`` at a time (None for a key gone meanwhile)."""
    if len(keys) <= 1:
        return [store.get_json_or(k) for k in keys]
    with ThreadPoolExecutor(max_workers=min(readers, len(keys))) as pool:
        return list(pool.map(lambda k: store.get_json_or(k), keys))


def step_folder(kind: str) -> str:
    """``steps`` for a train step, ``evals`` for an eval (ValueError otherwise)."""
    if kind not in ("train", "eval"):
        raise ValueError(f"kind must be 'train' or 'eval', got {kind!r}")
    return "steps" if kind == "train" else "evals"


def steps_with_rollouts(store: Store, run_id: str, kind: str = "train", cfg: RunConfig | None = None) -> list[int]:
    """The steps (or evals) that hold rollout records, sorted. Lists the whole ``steps/`` prefix: for the
    CLI and a rebuild, never for publishing one step.

    The group engine (``cfg.admission == "group"``, read from the run's config when ``cfg`` is None) keeps a
    train step's rollouts in the folders of the groups it consumed (`consumed_groups`): its steps are those
    with a summary (every decided step consumed groups), the step the run is training (its groups are
    in the run state's ``step_metrics`` until its summary is written), and the step the run is at when groups
    no step consumed wait in its buffer (`waiting_groups`)."""
    prefix = layout.summaries_prefix(run_id, step_folder(kind))
    keys = store.list_keys(prefix)
    found = set()
    for key in keys:
        head, _, rest = key[len(prefix):].partition("/")
        if head.isdigit() and "/rollouts/" in f"/{rest}":
            found.add(int(head))
    if kind == "train" and _group_engine(store, run_id, cfg):
        for key in keys:
            head, _, rest = key[len(prefix):].partition("/")
            if head.isdigit() and rest == layout.SUMMARY_NAME:
                found.add(int(head))
        state = read_state(store, run_id)
        if state is not None and isinstance(state.step_metrics.get("step"), int) \
                and state.step_metrics.get("consumed_groups"):
            found.add(int(state.step_metrics["step"]))
        if state is not None and state.step not in found:
            waiting = waiting_groups(store, run_id)
            if waiting.trained or waiting.filtered:  # rolled out, not consumed yet (or never: a run that ended)
                found.add(state.step)
    return sorted(found)


def _group_engine(store: Store, run_id: str, cfg: RunConfig | None) -> bool:
    if cfg is None:
        try:
            cfg = read_config(store, run_id)
        except Unreadable:
            return False
    return getattr(cfg, "admission", "batch") == "group"


def step_records(store: Store, run_id: str, step: int, kind: str = "train") -> list[RolloutRecord]:
    """Every current rollout record of a step (all its generation batches) or eval, in (generation
    batch, item) order: what ComputeAdvantages loads.

    When an item has several records (a resumed run re-did the step, a re-run Map child), the one
    whose sid its start marker names is kept, as ComputeAdvantages keeps it. Raises `Unreadable` for
    a record that is not a `RolloutRecord` (ComputeAdvantages could not have read it either)."""
    prefix = layout.summaries_prefix(run_id, step_folder(kind)) + f"{step}/"
    keys = [k for k in store.list_keys(prefix) if "/rollouts/" in k and k.endswith(".json")]
    return _current(store, keys, read_many(store, keys),
                    lambda gen, i: layout.start_marker_key(run_id, step, gen, kind, i))


def _current(store: Store, keys: list[str], bodies: list[Any], marker_key: Any) -> list[RolloutRecord]:
    """The records read at ``keys`` (``bodies``; None: gone meanwhile), one per (generation batch, item) in that
    order: of several, the one whose sid its start marker (``marker_key(generation_batch, i)``) names, as
    ComputeAdvantages keeps it (`stepwise.aws.runstore.RunStore.batch_rollouts`). Raises `Unreadable`."""
    by_item: dict[tuple[int, int], list[RolloutRecord]] = {}
    for key, body in zip(keys, bodies):
        if body is None:
            continue
        try:
            r = RolloutRecord.model_validate(body)
        except ValidationError as e:
            raise Unreadable(where(store, key), _problem(e)) from None
        by_item.setdefault((r.generation_batch, r.i), []).append(r)
    out = []
    for (gen, i), found in sorted(by_item.items()):
        if len(found) > 1:
            marker = store.get_json_or(marker_key(gen, i)) or {}
            sid = marker.get("sid") if isinstance(marker, Mapping) else None
            found = [r for r in found if r.sid == sid] or found[-1:]
        out.append(found[0])
    return out


# ---------------------------------------------------------------------------- the group engine's steps


@dataclass
class ConsumedGroups:
    """What a group-engine step (``admission: group``) consumed: the groups it trained, in the order it chose
    them, and those DAPO filtered for it (``(group, attempt)`` pairs, as ComputeAdvantages recorded them in the
    step's ``consumed_groups`` and ``filtered_groups``); its ``decision`` (None: the step is training, its
    summary not written yet) and the policy version its update applied to (None when not known)."""

    trained: list[tuple[int, int]]
    filtered: list[tuple[int, int]]
    decision: str | None = None
    update_version: int | None = None


def _pairs(value: Any) -> list[tuple[int, int]]:
    out = []
    for pair in value if isinstance(value, list) else []:
        if isinstance(pair, (list, tuple)) and len(pair) == 2 and all(isinstance(x, int) for x in pair):
            out.append((int(pair[0]), int(pair[1])))
    return out


def consumed_groups(store: Store, run_id: str, step: int, summary: Mapping[str, Any] | None = None,
                    state: RunState | None = None) -> ConsumedGroups | None:
    """The groups a group-engine train step consumed: from its summary (``summary``, as read), else, while it
    trains, from the run state's ``step_metrics`` (``state``, or one GET). None when neither names them (a step
    not decided yet: no group is its own before ComputeAdvantages takes them)."""
    if isinstance(summary, Mapping) and "consumed_groups" in summary:
        decision = summary.get("decision")
        version = summary.get("policy_version")  # Rebind's: the version after the update
        update = version - 1 if decision == "train" and isinstance(version, int) else None
        return ConsumedGroups(_pairs(summary.get("consumed_groups")), _pairs(summary.get("filtered_groups")),
                              decision if isinstance(decision, str) else None, update)
    state = state if state is not None else read_state(store, run_id)
    metrics = state.step_metrics if state is not None else {}
    if metrics.get("step") != step or "consumed_groups" not in metrics:
        return None
    return ConsumedGroups(_pairs(metrics.get("consumed_groups")), _pairs(metrics.get("filtered_groups")), None,
                          state.policy_version if state is not None and state.step == step else None)


def waiting_groups(store: Store, run_id: str) -> ConsumedGroups:
    """The groups of a group-engine run that no step has consumed yet, from its buffer (``buffer.json``, one GET):
    the complete ones (``trained``: what the next step may train) and those DAPO filtered since the last step,
    id order; none when the run has no buffer. Raises `Unreadable` for a buffer that is not a `GroupBuffer`."""
    from stepwise.records import GroupBuffer

    key = layout.buffer_key(run_id)
    body = read_json(store, key)
    if body is None:
        return ConsumedGroups([], [])
    if not isinstance(body, Mapping):
        raise Unreadable(where(store, key), f"a JSON {type(body).__name__}, not a group buffer object")
    try:
        buffer = GroupBuffer.model_validate(dict(body))
    except ValidationError as e:
        raise Unreadable(where(store, key), _problem(e)) from None
    return ConsumedGroups(sorted((g.id, g.attempt) for g in buffer.groups if g.status == "complete"),
                          sorted((int(g), int(a)) for g, a in buffer.filtered))


def _list_many(store: Store, prefixes: list[str]) -> list[list[str]]:
    if len(prefixes) <= 1:
        return [store.list_keys(p) for p in prefixes]
    with ThreadPoolExecutor(max_workers=min(READERS, len(prefixes))) as pool:
        return list(pool.map(store.list_keys, prefixes))


def group_records(store: Store, run_id: str, groups: list[tuple[int, int]]) -> list[list[RolloutRecord]]:
    """The current rollout records of each group ``(group, attempt)`` (``runs/{run}/groups/{g}/a{n}/rollouts/``,
    a lost rollout's record included), each in item order, in the order given: what the group engine's
    ComputeAdvantages reads (`stepwise.handlers.advantages.chosen_group_rollouts`). One LIST per group and a GET
    per record, in parallel: a constant number per step. Raises `Unreadable` for a record that is not one."""
    prefixes = [layout.rollouts_prefix(run_id, 0, 0, group=g, attempt=a) for g, a in groups]
    listed = [[k for k in keys if k.endswith(".json")] for keys in _list_many(store, prefixes)]
    bodies = read_many(store, [k for keys in listed for k in keys])
    out, n = [], 0
    for (g, a), keys in zip(groups, listed):
        out.append(_current(store, keys, bodies[n:n + len(keys)],
                            lambda gen, i, g=g, a=a: layout.start_marker_key(run_id, 0, gen, "train", i, group=g,
                                                                             attempt=a)))
        n += len(keys)
    return out


def group_judgements(store: Store, run_id: str, groups: list[tuple[int, int]]) -> list[dict[str, JudgeRecord]]:
    """The group judge's record of each group ``(group, attempt)`` (``.../groups/{g}/a{n}/judge/``), by input id,
    in the order given (empty: not judged): what the group engine's ComputeAdvantages merges
    (`stepwise.judging.judged_groups`). Raises `Unreadable` for a record that is not a `JudgeRecord`."""
    prefixes = [layout.judge_prefix(run_id, 0, 0, group=g, attempt=a) for g, a in groups]
    listed = [[k for k in keys if k.endswith(".json")] for keys in _list_many(store, prefixes)]
    bodies = read_many(store, [k for keys in listed for k in keys])
    out, n = [], 0
    for keys in listed:
        records = (_judge_record(store, key, body) for key, body in zip(keys, bodies[n:n + len(keys)]))
        out.append({r.input_id: r for r in records if r is not None})
        n += len(keys)
    return out


def read_view(store: Store, run_id: str, cfg: RunConfig, kind: str, step: int,
              summary: Mapping[str, Any] | None) -> StepView:
    """The step's (or eval's) `stepwise.views.steps.StepView` from its records, the group judge's records (a run
    with a judge) and its summary (``summary``, as read; None: none yet). A group-engine train step
    (``admission: group``) is read from the folders of the groups it consumed (`consumed_groups`,
    `group_records`, `group_judgements`: `stepwise.views.steps.group_step_view`); any other from the step's
    folder (`step_records`, `step_judgements`: `stepwise.views.steps.step_view`). Raises `Unreadable`."""
    from stepwise.views.steps import StepView, group_step_view, step_view

    decision = summary.get("decision") if kind == "train" and isinstance(summary, Mapping) else None
    if kind == "train" and cfg.admission == "group":
        state = None if isinstance(summary, Mapping) and "consumed_groups" in summary else read_state(store, run_id)
        consumed = consumed_groups(store, run_id, step, summary, state)
        pending = False
        if consumed is None and state is not None and state.step == step and summary is None:
            consumed, pending = waiting_groups(store, run_id), True  # the step the run is at: not consumed yet
        if consumed is None or not (consumed.trained or consumed.filtered):
            return StepView(kind, step, [], decision, "", 0, "no group consumed by this step yet")
        judged = cfg.judge is not None
        return group_step_view(
            group_records(store, run_id, consumed.trained), group_records(store, run_id, consumed.filtered), cfg,
            step=step, decision=consumed.decision if consumed.decision is not None else decision,
            groups=consumed.trained, filtered=consumed.filtered, update_version=consumed.update_version,
            judgements=group_judgements(store, run_id, consumed.trained) if judged else None,
            filtered_judgements=group_judgements(store, run_id, consumed.filtered) if judged else None,
            pending=pending)
    judgements = step_judgements(store, run_id, step) if kind == "train" and cfg.judge is not None else None
    return step_view(step_records(store, run_id, step, kind), cfg, kind=kind, step=step, decision=decision,
                     judgements=judgements)


def step_judgements(store: Store, run_id: str, step: int) -> dict[int, dict[str, JudgeRecord]]:
    """The group judge's records of a training step (``.../gen{g}/judge/{input_id}.json``), by generation batch
    and input id: what ComputeAdvantages merges into the step's rollouts (`stepwise.core.judge.apply_judgements`;
    `stepwise.views.steps.step_view` merges them the same way). Empty for a step no group was judged in yet.
    Raises `Unreadable` for a record that is not a `JudgeRecord` (ComputeAdvantages could not have read it)."""
    prefix = layout.summaries_prefix(run_id, "steps") + f"{step}/"
    found = []  # (generation batch, key): the batch from the key's folder, as ComputeAdvantages lists each batch's
    for key in store.list_keys(prefix):
        head, _, rest = key[len(prefix):].partition("/")
        if head.startswith("gen") and head[3:].isdigit() and rest.startswith("judge/") and key.endswith(".json"):
            found.append((int(head[3:]), key))
    out: dict[int, dict[str, JudgeRecord]] = {}
    for (gen, key), body in zip(found, read_many(store, [k for _, k in found])):
        if (record := _judge_record(store, key, body)) is not None:
            out.setdefault(gen, {})[record.input_id] = record
    return out


def _judge_record(store: Store, key: str, body: Any) -> JudgeRecord | None:
    """The `JudgeRecord` read at ``key`` (``body``; None: gone meanwhile). Raises `Unreadable` for one that is
    not a `JudgeRecord` (ComputeAdvantages could not have read it)."""
    if body is None:
        return None
    try:
        return JudgeRecord.model_validate(body)
    except ValidationError as e:
        raise Unreadable(where(store, key), _problem(e)) from None


def rollout_turns(store: Store, run_id: str, sid: str) -> list[dict[str, Any]]:
    """The rollout's captured turns in key order (completion order)."""
    keys = [k for k in store.list_keys(layout.turns_prefix(run_id, sid)) if k.endswith(".json")]
    return [t for t in read_many(store, keys) if isinstance(t, dict)]


@dataclass
class Tokenizer:
    """The run's tokenizer as a decoder: ``decode(ids)`` with special tokens kept."""

    impl: Any

    def decode(self, ids: list[int]) -> str:
        return self.impl.decode(ids, skip_special_tokens=False)


_TOKENIZERS: dict[tuple[int, str], Tokenizer | None] = {}
_TOKENIZER_LOCK = threading.Lock()


def _decoder(folder: str) -> Any:
    """A decoder of the tokenizer saved in ``folder``: its ``tokenizer.json`` through the ``tokenizers`` library
    (what a fast ``transformers`` tokenizer decodes with: the same text, without importing ``transformers``,
    which took 15-20 s of a loaded machine's CPU before a page's first table); ``transformers.AutoTokenizer``
    when there is no ``tokenizer.json``, or when its config asks for ``clean_up_tokenization_spaces`` (which
    ``transformers`` applies after the backend's decode, except for BPE models)."""
    config_path, fast_path = os.path.join(folder, "tokenizer_config.json"), os.path.join(folder, "tokenizer.json")
    try:
        with open(config_path, encoding="utf-8") as fh:
            cleans_up = bool(json.load(fh).get("clean_up_tokenization_spaces"))
    except (OSError, ValueError, AttributeError):
        cleans_up = False
    if os.path.isfile(fast_path) and not cleans_up:
        from tokenizers import Tokenizer as FastTokenizer

        return FastTokenizer.from_file(fast_path)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def load_tokenizer(store: Store, run_id: str) -> Tokenizer | None:
    """The run's tokenizer from ``runs/{run_id}/tokenizer/``, once per store and run; None when there is
    none or it does not load (the views then show token counts instead of text). Its files are copied to
    a temporary folder, loaded from there (`_decoder`: the ``tokenizers`` library, or ``transformers``) and the folder removed
    (a Lambda's ``/tmp`` is 512 MB and a container serves many runs)."""
    key = (id(store), run_id)
    with _TOKENIZER_LOCK:
        if key in _TOKENIZERS:
            return _TOKENIZERS[key]
        tok: Tokenizer | None = None
        try:
            prefix = layout.tokenizer_prefix(run_id)
            keys = [k for k in store.list_keys(prefix) if not k.endswith("/")]
            if keys:
                with tempfile.TemporaryDirectory(prefix="stepwise-tokenizer-") as dest:
                    for k in keys:
                        path = os.path.join(dest, k[len(prefix):])
                        os.makedirs(os.path.dirname(path), exist_ok=True)
                        with open(path, "wb") as fh:
                            fh.write(store.get_bytes(k))
                    tok = Tokenizer(_decoder(dest))
        except Exception:  # a view without text is still a view
            tok = None
        _TOKENIZERS[key] = tok
        return tok


def rollout_detail(store: Store, run_id: str, rollout: RolloutRecord, *, trained: bool | None = True,
                   tokenizer: Tokenizer | None = None) -> dict[str, Any]:
    """One rollout's conversation and trained spans: ``{"messages": conversation(...), "records":
    [[Span.to_json(), ...] per TraceRecord], "turns": n}`` (``trained``: its group's, as
    `stepwise.views.rollout.conversation` takes it)."""
    from stepwise.views.rollout import conversation, token_spans

    turns = rollout_turns(store, run_id, rollout.sid) if rollout.sid else []
    records = [r for r in rollout.records if isinstance(r, Mapping)]
    decode = tokenizer.decode if tokenizer is not None else None
    return {"messages": conversation(turns, records, trained=trained), "turns": len(turns),
            "records": [[s.to_json() for s in token_spans(r, decode)] for r in records]}


def find_rollout(rollouts: list[RolloutRecord], sid: str) -> RolloutRecord | None:
    """The record whose sid is ``sid`` or starts with it (a unique prefix); None when none or several."""
    exact = [r for r in rollouts if r.sid == sid]
    if exact:
        return exact[0]
    found = [r for r in rollouts if isinstance(r.sid, str) and r.sid.startswith(sid)]
    return found[0] if len(found) == 1 else None
