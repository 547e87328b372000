"""A whole run as a person reads it: one step's view, and the report page rebuilt from every object.

Through any store (`stepwise.views.store`). `read_step` is what `stepwise rollouts` prints; `rebuild_page`
is `stepwise report` on a local run folder (and ``--rebuild`` on a deployed run) and run-local's
``report.html``: it folds every summary and sample table into a fresh `stepwise.records.ReportIndex`
and makes the table of every step the Track function did not (a run from before it, a Track that
failed, the step a failed run ended at), so the page is the one Track would have written. It reads
every step once: a one-off, never what publishing a step costs (`stepwise.views.publish`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stepwise import layout
from stepwise.records import ReportIndex
from stepwise.views import index as ix
from stepwise.views.page import PageInputs, curve_keys, render_page
from stepwise.views.publish import make_table, read_index
from stepwise.views.steps import StepView
from stepwise.views.store import (Tokenizer, load_tokenizer, read_config, read_json, read_many, read_state,
                                  read_view, step_folder, steps_with_rollouts)

if TYPE_CHECKING:
    from stepwise.config import RunConfig

__all__ = ["fold", "read_step", "rebuild_page"]


def read_step(store: Any, run_id: str, step: int, kind: str = "train", cfg: RunConfig | None = None) -> StepView:
    """The step's (or eval's) `stepwise.views.steps.StepView` from its records, the group judge's records (a run
    with a judge) and the summary's decision (`stepwise.views.store.read_view`: a group-engine step's from the
    groups it consumed). Raises `stepwise.views.store.Unreadable` for a damaged config,
    rollout record or judge record."""
    cfg = cfg if cfg is not None else read_config(store, run_id)
    summary = read_json(store, layout.step_summary_key(run_id, step_folder(kind), step)) if kind == "train" else None
    return read_view(store, run_id, cfg, kind, step, summary if isinstance(summary, dict) else None)


def _numbered(store: Any, prefix: str, suffix: str) -> dict[int, dict[str, Any]]:
    keys = [k for k in store.list_keys(prefix) if k.endswith(suffix)]
    steps = []
    for key in keys:
        head = key[len(prefix):].split("/", 1)[0].removesuffix(".json")
        steps.append(int(head) if head.isdigit() else None)
    chosen = [(s, k) for s, k in zip(steps, keys) if s is not None and (suffix != ".json" or "/" not in k[len(prefix):])]
    bodies = read_many(store, [k for _, k in chosen])
    return {s: b for (s, _), b in zip(chosen, bodies) if isinstance(b, dict)}


def fold(store: Any, run_id: str, cfg: RunConfig, *, tokenizer: Tokenizer | None = None
         ) -> tuple[ReportIndex, dict[tuple[str, int], dict[str, Any]]]:
    """A report index and every sample table from the run's objects: its summaries, the tables Track
    wrote, and a table made here for every step or eval with rollout records and none. The stored
    index's tracking warnings are kept."""
    index = ReportIndex()
    try:
        stored, _ = read_index(store, run_id)
        index.warnings = list(stored.warnings)
    except (ValueError, TypeError):  # a damaged index only loses its tracking warnings: the rest is rebuilt
        pass
    tables: dict[tuple[str, int], dict[str, Any]] = {}
    for kind in ("train", "eval"):
        folder = step_folder(kind)
        summaries = _numbered(store, layout.summaries_prefix(run_id, folder), "/" + layout.SUMMARY_NAME)
        written = _numbered(store, layout.report_prefix(run_id) + folder + "/", ".json")
        steps = sorted(set(summaries) | set(written) | set(steps_with_rollouts(store, run_id, kind, cfg)))
        for step in steps:
            table = written.get(step)
            if table is None:
                tokenizer = tokenizer or load_tokenizer(store, run_id)
                table = make_table(store, run_id, cfg, kind, step, summaries.get(step), tokenizer)
            tables[(kind, step)] = table
            ix.add_step(index, kind, step, summaries.get(step), table, curve_keys=curve_keys(kind), track=False)
    return index, tables


def rebuild_page(store: Any, run_id: str, *, updated_at: str = "", link_prefix: str = "",
                 tokenizer: Tokenizer | None = None,
                 folded: tuple[ReportIndex, dict[tuple[str, int], dict[str, Any]]] | None = None) -> str:
    """The report page from the run's objects (`fold`, or ``folded``: what `fold` returned for this run);
    nothing is written. Raises `stepwise.views.store.Unreadable` for a damaged ``config.json`` or ``state.json``."""
    cfg = read_config(store, run_id)
    state = read_state(store, run_id)
    index, tables = folded if folded is not None else fold(store, run_id, cfg, tokenizer=tokenizer)
    recent = [tables[(k, s)] for k, s in index.recent[-ix.RECENT:] if (k, s) in tables]
    return render_page(PageInputs(run_id=run_id, config=cfg, state=state, index=index, tables=recent,
                                  ended=store.get_json_or(layout.run_summary_key(run_id)), updated_at=updated_at,
                                  link_prefix=link_prefix))
