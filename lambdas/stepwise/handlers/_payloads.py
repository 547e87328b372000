"""A batch's prompts from the run's dataset snapshot: PlanStep's generation batches and the group engine's
groups (`stepwise.handlers._groups`) read their rows through here."""

from __future__ import annotations

from typing import Any

from stepwise.handlers._common import dependencies, logger
from stepwise.layout import dataset_index_key
from stepwise.records import RunState


def batch_payloads(run_id: str, kind: str, rows: list[int], source: str) -> dict[int, dict[str, Any]]:
    """``{row: payload}`` of a batch's rows from the run's dataset snapshot (Init's shards).

    Reads the snapshot's index (cached per container: it never changes) and only the shards holding
    ``rows``, so memory and bytes read do not grow with the dataset. A run whose Init predates the
    snapshots has no index: its ``source`` is streamed up to the last row needed instead.
    """
    from stepwise.aws.datasets import shard_reader
    from stepwise.datasets import DatasetIndex, iter_payloads, read_rows

    deps = dependencies()
    rs = deps.store
    key = ("dataset_index", run_id, kind)
    if key not in deps.cache:
        try:
            deps.cache[key] = DatasetIndex.model_validate(rs.get_json(dataset_index_key(run_id, kind)))
        except KeyError:
            logger.warning("no dataset snapshot (run started before snapshots): streaming the source",
                           extra={"kind": kind, "source": source})
            wanted, last = set(rows), max(rows, default=-1)
            out: dict[int, dict[str, Any]] = {}
            for i, payload in enumerate(iter_payloads(source, s3_client=rs.s3)):
                if i in wanted:
                    out[i] = payload
                if i >= last:
                    break
            return out
    return read_rows(rows, deps.cache[key], shard_reader(rs.s3, rs.bucket, run_id, kind))


def eval_payloads(run_id: str, state: RunState, cfg: Any, rows: list[int]) -> dict[int, dict[str, Any]]:
    """``{row: payload}`` of an eval batch's rows, which span the eval sets' shared row space
    (`stepwise.records.EvalSetRows`): each set's rows are read from its own snapshot."""
    from stepwise.core.evals import eval_sets_of

    out: dict[int, dict[str, Any]] = {}
    paths = cfg.eval_set_paths
    for s in eval_sets_of(state):
        mine = [r for r in rows if s.offset <= r < s.offset + s.rows]
        if mine:
            local = batch_payloads(run_id, s.kind, [r - s.offset for r in mine], paths.get(s.name, ""))
            out.update({r: local[r - s.offset] for r in mine})
    return out
