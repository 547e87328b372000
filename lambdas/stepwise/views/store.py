"""What a person reads of a run, gathered from the objects the run already stores.

Reads through any *store* with ``get_json(key)``, ``get_json_or(key, default)``, ``get_bytes(key)``
and ``list_keys(prefix)``: the S3 run store (`stepwise.aws.runstore.RunStore`: the report function,
and the CLI against a deployed stack) or a local run folder's copy of the bucket
(`stepwise_cli.sources.DirStore`), so both read a run the same way. Keys come from
`stepwise.layout`; what the records mean from `stepwise.records`; the views from
`stepwise.core.rollouts`.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from stepwise import layout
from stepwise.core.rollouts import GroupView, conversation, group_views, token_spans


class Store(Protocol):
    def get_json(self, key: str) -> Any: ...
    def get_json_or(self, key: str, default: Any = None) -> Any: ...
    def get_bytes(self, key: str) -> bytes: ...
    def list_keys(self, prefix: str) -> list[str]: ...


#: Parallel reads of many small objects (rollout records, summaries): S3 answers each in ~10-30 ms.
READERS = 16


def read_many(store: Store, keys: list[str], *, readers: int = READERS) -> list[Any]:
    """``store.get_json`` of every key, in order, ``readers`` at a time (None for a key gone meanwhile)."""
    if len(keys) <= 1:
        return [store.get_json_or(k) for k in keys]
    with ThreadPoolExecutor(max_workers=min(readers, len(keys))) as pool:
        return list(pool.map(lambda k: store.get_json_or(k), keys))


def run_config(store: Store, run_id: str) -> dict[str, Any]:
    """The run's ``config.json`` (validated RunConfig JSON); {} when absent."""
    cfg = store.get_json_or(layout.config_key(run_id))
    return cfg if isinstance(cfg, dict) else {}


def step_folder(kind: str) -> str:
    """``steps`` for a train step, ``evals`` for an eval (ValueError otherwise)."""
    if kind not in ("train", "eval"):
        raise ValueError(f"kind must be 'train' or 'eval', got {kind!r}")
    return "steps" if kind == "train" else "evals"


def steps_with_rollouts(store: Store, run_id: str, kind: str = "train") -> list[int]:
    """The steps (or evals) that hold rollout records, sorted."""
    prefix = layout.summaries_prefix(run_id, step_folder(kind))
    found = set()
    for key in store.list_keys(prefix):
        head, _, rest = key[len(prefix):].partition("/")
        if head.isdigit() and "/rollouts/" in f"/{rest}":
            found.add(int(head))
    return sorted(found)


def step_rollouts(store: Store, run_id: str, step: int, kind: str = "train") -> list[dict[str, Any]]:
    """Every current rollout record of a step (all its generation batches) or eval, in item order.

    When an item has several records (a resumed run re-did the step, a re-run Map child), the one
    whose sid its start marker names is kept, as ComputeAdvantages keeps it."""
    prefix = layout.summaries_prefix(run_id, step_folder(kind)) + f"{step}/"
    keys = [k for k in store.list_keys(prefix) if "/rollouts/" in k and k.endswith(".json")]
    records = [r for r in read_many(store, keys) if isinstance(r, dict)]
    by_item: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for r in records:
        by_item.setdefault((int(r.get("generation_batch") or 0), int(r.get("i") or 0)), []).append(r)
    out = []
    for (gen, i), found in sorted(by_item.items()):
        if len(found) > 1:
            marker = store.get_json_or(layout.start_marker_key(run_id, step, gen, kind, i)) or {}
            found = [r for r in found if r.get("sid") == marker.get("sid")] or found[-1:]
        out.append(found[0])
    return out


def rewards_of(cfg: Mapping[str, Any]) -> Callable[[Mapping[str, Any]], float] | None:
    """The reward ComputeAdvantages' estimator sees: DAPO adds the overlong penalty
    (`stepwise.core.dapo.overlong_penalty`) when ``overlong_buffer_len`` is set; else None (raw)."""
    if cfg.get("algorithm") != "dapo" or not cfg.get("overlong_buffer_len"):
        return None
    from stepwise.core.dapo import overlong_penalty

    def shaped(r: Mapping[str, Any]) -> float:
        return float(r.get("reward") or 0.0) + overlong_penalty(
            int(r.get("sampled_tokens") or 0), max_len=int(cfg["max_tokens_per_rollout"]),
            buffer_len=int(cfg["overlong_buffer_len"]), penalty_factor=float(cfg.get("overlong_penalty_factor", 1.0)))
    return shaped


def turn_rewards_of(cfg: Mapping[str, Any]) -> Callable[[Mapping[str, Any]], list[float]] | None:
    """A member's per-turn rewards as a per-turn estimator sees them (`stepwise.core.steps.shaped_turn_rewards`:
    DAPO's overlong penalty on the last turn), or None when the run's estimator reads returns."""
    from stepwise.core.advantages import PER_TURN_ESTIMATORS

    if cfg.get("advantage_estimator") not in PER_TURN_ESTIMATORS:
        return None
    shaped = rewards_of(cfg)

    def per_turn(r: Mapping[str, Any]) -> list[float]:
        rewards_T = [float(x) for x in r.get("turn_rewards") or [] if isinstance(x, (int, float))]
        if rewards_T and shaped is not None:
            rewards_T[-1] += shaped(r) - float(r.get("reward") or 0.0)
        return rewards_T
    return per_turn


def step_groups(store: Store, run_id: str, step: int, kind: str = "train",
                cfg: Mapping[str, Any] | None = None,
                rollouts: list[dict[str, Any]] | None = None) -> list[GroupView]:
    """The step's groups with rewards and advantages (`stepwise.core.rollouts.group_views`)."""
    cfg = run_config(store, run_id) if cfg is None else cfg
    rollouts = step_rollouts(store, run_id, step, kind) if rollouts is None else rollouts
    return group_views(rollouts, train=kind == "train", rewards_of=rewards_of(cfg),
                       estimator=str(cfg.get("advantage_estimator") or "grpo"), turn_rewards_of=turn_rewards_of(cfg))


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


def load_tokenizer(store: Store, run_id: str) -> Tokenizer | None:
    """The run's tokenizer from ``runs/{run_id}/tokenizer/`` (copied to a temp folder, loaded with
    ``transformers.AutoTokenizer``), once per store and run; None when there is none or it does not
    load (the views then show token counts instead of text)."""
    key = (id(store), run_id)
    with _TOKENIZER_LOCK:
        if key in _TOKENIZERS:
            return _TOKENIZERS[key]
        tok: Tokenizer | None = None
        try:
            prefix = layout.tokenizer_prefix(run_id)
            keys = [k for k in store.list_keys(prefix) if not k.endswith("/")]
            if keys:
                dest = tempfile.mkdtemp(prefix="stepwise-tokenizer-")
                for k in keys:
                    path = os.path.join(dest, k[len(prefix):])
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    with open(path, "wb") as fh:
                        fh.write(store.get_bytes(k))
                from transformers import AutoTokenizer

                tok = Tokenizer(AutoTokenizer.from_pretrained(dest))
        except Exception:  # a view without text is still a view
            tok = None
        _TOKENIZERS[key] = tok
        return tok


def rollout_detail(store: Store, run_id: str, rollout: Mapping[str, Any], *,
                   tokenizer: Tokenizer | None = None) -> dict[str, Any]:
    """One rollout's conversation and trained spans: ``{"messages": conversation(...), "records":
    [[Span.to_json(), ...] per TraceRecord], "turns": n}`` (records as FinishRollout stored them)."""
    sid = rollout.get("sid")
    turns = rollout_turns(store, run_id, sid) if isinstance(sid, str) and sid else []
    records = [r for r in rollout.get("records") or [] if isinstance(r, Mapping)]
    decode = tokenizer.decode if tokenizer is not None else None
    return {"messages": conversation(turns, records), "turns": len(turns),
            "records": [[s.to_json() for s in token_spans(r, decode)] for r in records]}


def find_rollout(rollouts: list[dict[str, Any]], sid: str) -> dict[str, Any] | None:
    """The record whose sid is ``sid`` or starts with it (a unique prefix); None when none or several."""
    exact = [r for r in rollouts if r.get("sid") == sid]
    if exact:
        return exact[0]
    found = [r for r in rollouts if isinstance(r.get("sid"), str) and r["sid"].startswith(sid)]
    return found[0] if len(found) == 1 else None


# ---------------------------------------------------------------------------- the report page


def summaries(store: Store, run_id: str, folder: str) -> dict[int, dict[str, Any]]:
    """``{step: summary}`` of the run's train steps (``folder="steps"``) or evals (``"evals"``)."""
    prefix = layout.summaries_prefix(run_id, folder)
    keys = [k for k in store.list_keys(prefix)
            if k.endswith("/" + layout.SUMMARY_NAME) and k[len(prefix):].split("/", 1)[0].isdigit()]
    out = {}
    for key, body in zip(keys, read_many(store, keys)):
        if isinstance(body, dict):
            out[int(key[len(prefix):].split("/", 1)[0])] = body
    return out


def sample_tables(store: Store, run_id: str) -> dict[tuple[str, int], dict[str, Any]]:
    """``{(kind, step): sample table}`` the Track function wrote (`stepwise.layout.report_table_key`)."""
    prefix = layout.report_prefix(run_id)
    keys = [k for k in store.list_keys(prefix) if k.endswith(".json")]
    out = {}
    for body in read_many(store, keys):
        if isinstance(body, dict) and isinstance(body.get("step"), int) and body.get("kind") in ("train", "eval"):
            out[(body["kind"], body["step"])] = body
    return out


def step_table(store: Store, run_id: str, kind: str, step: int, *, cfg: Mapping[str, Any] | None = None,
               tokenizer: Tokenizer | None = None, summary: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A step's sample table (`stepwise.core.report.sample_table`) from its rollout records and
    the captured turns of the sampled groups."""
    from stepwise.core.report import sample_table

    rollouts = step_rollouts(store, run_id, step, kind)
    groups = step_groups(store, run_id, step, kind, cfg, rollouts)
    return sample_table(kind, step, groups, rollouts, lambda sid: rollout_turns(store, run_id, sid),
                        tokenizer.decode if tokenizer is not None else None, summary)


def report_inputs(store: Store, run_id: str, *, updated_at: str = "") -> Any:
    """Everything the page shows (`stepwise.core.report.ReportInputs`), read from the run's objects."""
    from stepwise.core.report import ReportInputs

    with ThreadPoolExecutor(max_workers=4) as pool:
        cfg = pool.submit(run_config, store, run_id)
        state = pool.submit(store.get_json_or, layout.state_key(run_id), {})
        ended = pool.submit(store.get_json_or, layout.run_summary_key(run_id))
        tables = pool.submit(sample_tables, store, run_id)
        steps, evals = summaries(store, run_id, "steps"), summaries(store, run_id, "evals")
        return ReportInputs(run_id=run_id, config=cfg.result(), state=state.result() or {}, steps=steps,
                            evals=evals, tables=tables.result(), ended=ended.result(), updated_at=updated_at)


def rebuild_page(store: Store, run_id: str, *, updated_at: str = "", tokenizer: Tokenizer | None = None) -> str:
    """The report page from the run's objects, making the sample table of every step and eval the
    Track function did not (a run from before it, or one whose Track failed); nothing is written."""
    from stepwise.core.report import render_page

    inputs = report_inputs(store, run_id, updated_at=updated_at)
    tables = dict(inputs.tables)
    cfg = inputs.config
    for kind, source in (("train", inputs.steps), ("eval", inputs.evals)):
        for step in steps_with_rollouts(store, run_id, kind):
            if (kind, step) not in tables:
                tokenizer = tokenizer or load_tokenizer(store, run_id)
                tables[(kind, step)] = step_table(store, run_id, kind, step, cfg=cfg, tokenizer=tokenizer,
                                                  summary=source.get(step))
    inputs.tables = tables
    return render_page(inputs)
