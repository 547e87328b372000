"""The S3 layout of the run bucket: every key and prefix, built here and nowhere else.

Layout (docs/internals.md, "S3 layout")::

    runs/{run_id}/config.json                               validated RunConfig, written once by Init
    runs/{run_id}/state.json                                RunState; every write conditional on the ETag
    runs/{run_id}/tokenizer/                                tokenizer files cached for the gateway
    runs/{run_id}/dataset/{kind}/index.json                 DatasetIndex of the run's dataset snapshot (Init)
    runs/{run_id}/dataset/{kind}/{shard:05d}.jsonl          its payloads, one JSON object per line (~1 MiB each)
    runs/{run_id}/steps/{step}/gen{g}/items.json            Distributed Map items (references only)
    runs/{run_id}/steps/{step}/gen{g}/prompts.json          {input_id: payload} for the items
    runs/{run_id}/steps/{step}/gen{g}/starts/{i}.json       {sid} item i was started with (the timeout path needs it)
    runs/{run_id}/steps/{step}/gen{g}/rollouts/{sid}.json   rollout record (reward, status, TraceRecords)
    runs/{run_id}/steps/{step}/gen{g}/judge/{input_id}.json the group judge's record of one group (scores, reasons)
    runs/{run_id}/steps/{step}/gen{g}/judge-progress.json   the judging of the batch (start, invocations, done)
    runs/{run_id}/judge-cache/{key}.json                    a judge verdict by the hash of what was judged
    runs/{run_id}/buffer.json                               the group engine's buffer (admission: group); conditional writes
    runs/{run_id}/groups/{g}/a{n}/...                       one group (attempt n): items, prompts, starts, rollouts as a batch's
    runs/{run_id}/groups/{g}/a{n}/complete.json             what the group's completion recorded (versions, DAPO, durations)
    runs/{run_id}/groups/{g}/a{n}/judge/{input_id}.json     the group judge's record of the group (a judged run)
    runs/{run_id}/groups/{g}/a{n}/judge-progress.json       its judging across invocations (start, invocations, done)
    runs/{run_id}/steps/{step}/datums/{chunk:04d}.json      forward_backward datum chunks
    runs/{run_id}/steps/{step}/summary.json                 the step's metrics
    runs/{run_id}/summary.json                              the run's end: status, reason, checkpoints (StopSession, Cleanup)
    runs/{run_id}/report/index.html                         the run report page (the Track function)
    runs/{run_id}/report/{steps|evals}/{step}.json          a step's sample table (never overwritten)
    runs/{run_id}/report/{steps|evals}/{step}.html          the same table as a page of its own (the report page links it)
    runs/{run_id}/report/index.json                         what the report page is drawn from (ReportIndex), kept as the run goes
    runs/{run_id}/evals/{step}/...                          eval generation batches (same shape as gen{g})
    runs/{run_id}/evals/{step}/results.json                 every prompt's eval rollouts (EvalResults), beside summary.json
    runs/{run_id}/sessions/{sid}/task_token.json            task token of a rollout started before it moved into sessions/{sid}.json
    runs/{run_id}/sessions/{sid}/turns/{key}.json           captured gateway turns
    runs/{run_id}/sampler/current.json                      the run's current sampler and its gate (RunSampler; Rebind)
    runs/{run_id}/sampler/leases/{deadline}-{id}.json       a turn's lease on the gate (the gateway, turn_gate)
    sessions/{sid}.json                                     gateway session record (+ the rollout's task token)
    rollout-results/{run_id}/{input_id}/{sid}.json          written by the agent (toolkit result key)
    datasets/{run_id}/{file name}                           local dataset files the operator uploaded (CLI, local stack)
    datasets/{run_id}/estimate.json                         the run's cost estimate (CLI, local stack), for the end's comparison
    leftovers/{run_id}.json                                 clean-up the run's end left (rollouts in flight, retention); the sweeper finishes it
    sagemaker-output/                                       the training sessions' default output path

The key functions accept ``"*"`` for an id, which gives the IAM resource pattern of that key
(``tokenizer_prefix("*") + "*"`` = ``runs/*/tokenizer/*``): the stack's grants and the code
name the same layout. `KEY_KINDS` classifies a key by the object it is (the local stack's S3
request log counts requests by kind).
"""

from __future__ import annotations

import re

#: Top-level prefixes of the bucket (lifecycle rules, notifications and grants are set per prefix).
RUNS_PREFIX = "runs/"
SESSIONS_PREFIX = "sessions/"
RESULTS_PREFIX = "rollout-results/"
DATASETS_PREFIX = "datasets/"
SAGEMAKER_OUTPUT_PREFIX = "sagemaker-output/"
#: What runs' ends left to clean up (`leftovers_key`): the session sweeper lists it on every pass.
LEFTOVERS_PREFIX = "leftovers/"

#: The object tag of bulky per-step data under runs/ (Map items, rollout records, datums): the
#: stack's lifecycle rule expires objects by it (a lifecycle filter matches prefixes and tags only).
BULK_TAG_KEY, BULK_TAG_VALUE = "stepwise-class", "bulk"
BULK_TAGGING = f"{BULK_TAG_KEY}={BULK_TAG_VALUE}"

#: The kinds of summary folders under a run: train steps and evals.
SUMMARY_FOLDERS = ("steps", "evals")


def run_prefix(run_id: str) -> str:
    return f"{RUNS_PREFIX}{run_id}/"


def config_key(run_id: str) -> str:
    return run_prefix(run_id) + "config.json"


def state_key(run_id: str) -> str:
    return run_prefix(run_id) + "state.json"


def tokenizer_prefix(run_id: str) -> str:
    return run_prefix(run_id) + "tokenizer/"


def dataset_index_key(run_id: str, kind: str) -> str:
    """The `stepwise.datasets.DatasetIndex` of the run's ``kind`` ("train" | "eval") dataset snapshot."""
    return run_prefix(run_id) + f"dataset/{kind}/index.json"


def dataset_shard_key(run_id: str, kind: str, shard: int) -> str:
    """Shard ``shard`` of the run's ``kind`` dataset snapshot (written once by Init, read by PlanStep)."""
    return run_prefix(run_id) + f"dataset/{kind}/{shard:05d}.jsonl"


def summaries_prefix(run_id: str, folder: str) -> str:
    """``runs/{run_id}/steps/`` (``folder="steps"``) or ``runs/{run_id}/evals/`` (``"evals"``): the
    numbered step folders whose ``summary.json`` the operator reads."""
    if folder not in SUMMARY_FOLDERS:
        raise ValueError(f"summary folder {folder!r}: expected one of {SUMMARY_FOLDERS}")
    return run_prefix(run_id) + f"{folder}/"


def batch_prefix(run_id: str, step: int, generation_batch: int, kind: str = "train", *,
                 group: int | None = None, attempt: int = 0) -> str:
    """Prefix of one generation batch: ``steps/{step}/gen{g}/`` (train) or ``evals/{step}/`` (eval); for
    the group engine's groups (``group`` given), the group's folder (`group_prefix`)."""
    if group is not None:
        return group_prefix(run_id, group, attempt)
    if kind == "eval":
        return summaries_prefix(run_id, "evals") + f"{step}/"
    return summaries_prefix(run_id, "steps") + f"{step}/gen{generation_batch}/"


def items_key(run_id: str, step: int, generation_batch: int, kind: str = "train", *,
              group: int | None = None, attempt: int = 0) -> str:
    return batch_prefix(run_id, step, generation_batch, kind, group=group, attempt=attempt) + "items.json"


def prompts_key(run_id: str, step: int, generation_batch: int, kind: str = "train", *,
                group: int | None = None, attempt: int = 0) -> str:
    return batch_prefix(run_id, step, generation_batch, kind, group=group, attempt=attempt) + "prompts.json"


def start_marker_key(run_id: str, step: int, generation_batch: int, kind: str, i: int, *,
                     group: int | None = None, attempt: int = 0) -> str:
    """Which sid item ``i`` of a batch was started with (the timeout path needs it)."""
    return start_markers_prefix(run_id, step, generation_batch, kind, group=group, attempt=attempt) + f"{i}.json"


def start_markers_prefix(run_id: str, step: int, generation_batch: int, kind: str = "train", *,
                         group: int | None = None, attempt: int = 0) -> str:
    """Prefix of a batch's start markers (`start_marker_key`): the rollouts started so far."""
    return batch_prefix(run_id, step, generation_batch, kind, group=group, attempt=attempt) + "starts/"


def rollouts_prefix(run_id: str, step: int, generation_batch: int, kind: str = "train", *,
                    group: int | None = None, attempt: int = 0) -> str:
    return batch_prefix(run_id, step, generation_batch, kind, group=group, attempt=attempt) + "rollouts/"


def rollout_key(run_id: str, step: int, generation_batch: int, sid: str, kind: str = "train", *,
                group: int | None = None, attempt: int = 0) -> str:
    return rollouts_prefix(run_id, step, generation_batch, kind, group=group, attempt=attempt) + f"{sid}.json"


def buffer_key(run_id: str) -> str:
    """``runs/{run_id}/buffer.json``: the group engine's buffer (`stepwise.records.GroupBuffer`); every write
    conditional on the ETag."""
    return run_prefix(run_id) + "buffer.json"


def groups_prefix(run_id: str) -> str:
    """``runs/{run_id}/groups/``: the group engine's groups, one folder per group and attempt."""
    return run_prefix(run_id) + "groups/"


def group_prefix(run_id: str, group: int | str, attempt: int | str = 0) -> str:
    """``runs/{run_id}/groups/{group}/a{attempt}/``: one group's rollouts (``items.json``, ``prompts.json``,
    ``starts/``, ``rollouts/`` as a generation batch's) and its ``complete.json``."""
    return groups_prefix(run_id) + f"{group}/a{attempt}/"


def group_complete_key(run_id: str, group: int | str, attempt: int | str = 0) -> str:
    """``.../groups/{group}/a{attempt}/complete.json``: what the group's completion recorded (its versions,
    whether DAPO keeps it, its durations; `stepwise.core.groups.CompleteMark`), written once by RecordGroupComplete."""
    return group_prefix(run_id, group, attempt) + "complete.json"


def judge_prefix(run_id: str, step: int, generation_batch: int, *, group: int | None = None, attempt: int = 0) -> str:
    """The group judge's records of a training generation batch (`stepwise.records.JudgeRecord`), one per group;
    the group engine's group (``group`` given): beside its rollouts, ``.../groups/{group}/a{attempt}/judge/``."""
    return batch_prefix(run_id, step, generation_batch, group=group, attempt=attempt) + "judge/"


def judge_record_key(run_id: str, step: int, generation_batch: int, input_id: str, *, group: int | None = None,
                     attempt: int = 0) -> str:
    return judge_prefix(run_id, step, generation_batch, group=group, attempt=attempt) + f"{input_id}.json"


def judge_progress_key(run_id: str, step: int, generation_batch: int, *, group: int | None = None,
                       attempt: int = 0) -> str:
    """The judging of a generation batch (or of the group engine's group ``group``) across the judge function's
    invocations (`stepwise.records.JudgeProgress`)."""
    return batch_prefix(run_id, step, generation_batch, group=group, attempt=attempt) + "judge-progress.json"


def judge_cache_key(run_id: str, key: str) -> str:
    """A validated judge verdict (`stepwise.records.JudgeVerdict`) by ``key``, the hash of the judge's config and
    the judged text (`stepwise.core.judge.cache_key`): a retried or re-done step judging the same text reads it."""
    return run_prefix(run_id) + f"judge-cache/{key}.json"


def datums_prefix(run_id: str, step: int) -> str:
    return summaries_prefix(run_id, "steps") + f"{step}/datums/"


def datums_key(run_id: str, step: int, chunk: int) -> str:
    return datums_prefix(run_id, step) + f"{chunk:04d}.json"


def step_summary_key(run_id: str, folder: str, step: int) -> str:
    """``runs/{run_id}/{folder}/{step}/summary.json`` (``folder``: "steps" | "evals")."""
    return summaries_prefix(run_id, folder) + f"{step}/summary.json"


def summary_key(run_id: str, step: int) -> str:
    return step_summary_key(run_id, "steps", step)


def eval_summary_key(run_id: str, step: int) -> str:
    return step_summary_key(run_id, "evals", step)


def eval_results_key(run_id: str, step: int) -> str:
    """``runs/{run_id}/evals/{step}/results.json``: every prompt's rollouts of that eval
    (`stepwise.records.EvalResults`), beside its summary."""
    return step_summary_key(run_id, "evals", step).removesuffix("summary.json") + "results.json"


def leftovers_key(run_id: str) -> str:
    """``leftovers/{run_id}.json``: the clean-up the run's end left to do (`stepwise.records.RunLeftovers`:
    rollouts still in flight, retention still to apply), one object per run with work left, under one
    top-level prefix so the session sweeper finds every run's with one listing. Deleted when done."""
    return f"{LEFTOVERS_PREFIX}{run_id}.json"


def run_id_of_leftovers(key: str) -> str | None:
    """The run id of a `leftovers_key`, or None for another key."""
    if not key.startswith(LEFTOVERS_PREFIX) or not key.endswith(".json"):
        return None
    run_id = key[len(LEFTOVERS_PREFIX):].removesuffix(".json")
    return run_id if run_id and "/" not in run_id else None


def run_summary_key(run_id: str) -> str:
    """``runs/{run_id}/summary.json``: how the run ended (StopSession and Cleanup write it; its S3
    notification, like a step summary's, runs the Track function)."""
    return run_prefix(run_id) + SUMMARY_NAME


#: Every summary's object name: the step, eval and run summaries end with it (the Track function's
#: S3 notification filter is prefix `RUNS_PREFIX`, suffix `SUMMARY_NAME`).
SUMMARY_NAME = "summary.json"


def parse_summary_key(key: str) -> tuple[str, str, int | None] | None:
    """``(run_id, kind, step)`` of a summary key: kind ``train`` (``runs/{run_id}/steps/{step}/summary.json``),
    ``eval`` (``.../evals/{step}/summary.json``) or ``run`` (``runs/{run_id}/summary.json``, step None);
    None for any other key (URL-decoded keys only)."""
    parts = key.split("/")
    if parts[0] + "/" != RUNS_PREFIX or parts[-1] != SUMMARY_NAME or not all(parts):
        return None
    if len(parts) == 3:
        return parts[1], "run", None
    if len(parts) == 5 and parts[2] in SUMMARY_FOLDERS and parts[3].isdigit() and parts[3].isascii():
        return parts[1], "train" if parts[2] == "steps" else "eval", int(parts[3])
    return None


def report_prefix(run_id: str) -> str:
    """``runs/{run_id}/report/``: the report page and the per-step sample tables it is built from."""
    return run_prefix(run_id) + "report/"


def report_key(run_id: str) -> str:
    """The run report page (one self-contained HTML page, rewritten after every step)."""
    return report_prefix(run_id) + "index.html"


def report_table_key(run_id: str, kind: str, step: int) -> str:
    """One step's (``kind="train"``) or eval's (``"eval"``) sample table and tracking warnings:
    written once by the Track function, never overwritten (its presence marks the step published)."""
    return report_prefix(run_id) + f"{'steps' if kind == 'train' else 'evals'}/{step}.json"


def report_step_page_key(run_id: str, kind: str, step: int) -> str:
    """One step's (or eval's) sample table as a page of its own, beside the report page (which links it
    relatively: ``steps/{step}.html``) once the step is no longer among the page's newest."""
    return report_prefix(run_id) + report_step_page_name(kind, step)


def report_step_page_name(kind: str, step: int) -> str:
    """The step page's key relative to the report page's folder (the page's link)."""
    return f"{'steps' if kind == 'train' else 'evals'}/{step}.html"


def report_index_key(run_id: str) -> str:
    """What the report page is drawn from (`stepwise.records.ReportIndex`): curves, failures, the newest
    steps and the trackers' outbox, kept by the Track function with conditional writes."""
    return report_prefix(run_id) + "index.json"


def session_key(sid: str) -> str:
    """The gateway session record (flat: the gateway knows only the sid)."""
    return f"{SESSIONS_PREFIX}{sid}.json"


def run_sessions_prefix(run_id: str) -> str:
    """``runs/{run_id}/sessions/``: what the run's rollouts left per session (turns, old task tokens)."""
    return run_prefix(run_id) + "sessions/"


def task_token_key(run_id: str, sid: str) -> str:
    """Where StartRollout stored a rollout's task token before the token moved into the session
    record (OnRolloutResult still reads it for sessions started then)."""
    return run_sessions_prefix(run_id) + f"{sid}/task_token.json"


def turns_prefix(run_id: str, sid: str) -> str:
    return run_sessions_prefix(run_id) + f"{sid}/turns/"


def sampler_prefix(run_id: str) -> str:
    """``runs/{run_id}/sampler/``: the run's current sampler and the turn leases on its gate
    (`stepwise.core.sampler_binding`)."""
    return run_prefix(run_id) + "sampler/"


def current_sampler_key(run_id: str) -> str:
    """``runs/{run_id}/sampler/current.json``: the run's current sampler and its gate (`stepwise.records.RunSampler`),
    written by Rebind around each load, read by the gateway for ``next_turn`` and ``turn_gate`` sessions."""
    return sampler_prefix(run_id) + "current.json"


def leases_prefix(run_id: str) -> str:
    """``runs/{run_id}/sampler/leases/``: one object per turn sampling under a ``turn_gate`` (Rebind lists it)."""
    return sampler_prefix(run_id) + "leases/"


#: Whole milliseconds in a lease key's deadline: fixed width, so keys sort by deadline.
_LEASE_RE = re.compile(r"/(?P<ms>\d{15})-(?P<uid>[0-9a-f]{32})\.json$")


def lease_key(run_id: str, deadline: float, lease_id: str) -> str:
    """``runs/{run_id}/sampler/leases/{deadline ms:015d}-{lease_id}.json``: a turn's lease, its deadline
    (epoch seconds) in its name so that one listing tells which leases are live (`lease_deadline`).
    ``lease_id``: 32 hex characters (a uuid4's ``hex``)."""
    return leases_prefix(run_id) + f"{round(deadline * 1000):015d}-{lease_id}.json"


def lease_deadline(key: str) -> float | None:
    """The deadline (epoch seconds) of a `lease_key`, or None for any other key."""
    m = _LEASE_RE.search(key)
    return None if m is None else int(m.group("ms")) / 1000


def results_exp_id(run_id: str) -> str:
    """The toolkit ``exp_id`` of a run: the agent writes ``{exp_id}/{input_id}/{sid}.json``."""
    return f"{RESULTS_PREFIX}{run_id}"


def results_prefix(run_id: str) -> str:
    """``rollout-results/{run_id}/``: every result object the run's agents wrote."""
    return results_exp_id(run_id) + "/"


def result_key(run_id: str, input_id: str, sid: str) -> str:
    return f"{results_prefix(run_id)}{input_id}/{sid}.json"


def parse_result_key(key: str) -> tuple[str, str, str]:
    """``rollout-results/{run_id}/{input_id}/{sid}.json`` -> ``(run_id, input_id, sid)``.

    The key must already be URL-decoded. Raises ValueError naming the expected shape.
    """
    parts = key.split("/")
    top = RESULTS_PREFIX.rstrip("/")
    if len(parts) != 4 or parts[0] != top or not parts[3].endswith(".json") or not all(parts):
        raise ValueError(f"not a rollout result key: {key!r}; expected {top}/RUN_ID/INPUT_ID/SID.json")
    return parts[1], parts[2], parts[3][: -len(".json")]


def upload_key(run_id: str, name: str) -> str:
    """``datasets/{run_id}/{name}``: a local file the operator's run reads (a dataset, or a
    tokenizer file under ``name = "tokenizer/{file}"``), uploaded by the CLI or the local stack."""
    return f"{DATASETS_PREFIX}{run_id}/{name}"


def estimate_key(run_id: str) -> str:
    """``datasets/{run_id}/estimate.json``: the run's cost estimate (`stepwise.core.costmodel`), written by
    ``stepwise start`` (and the local stack) beside the files it uploads; StopSession compares the
    ledger with it at the run's end."""
    return upload_key(run_id, "estimate.json")


def upload_tokenizer_prefix(run_id: str) -> str:
    """``datasets/{run_id}/tokenizer/``: a local tokenizer directory, uploaded (see `upload_key`)."""
    return upload_key(run_id, "tokenizer/")


#: Stands for an id in a key whose pattern `KEY_KINDS` needs.
_ID = "{ID}"


def _pattern(key: str) -> str:
    """``key`` (built with `_ID` for its ids) as a regex matching any ids."""
    return re.escape(key).replace(re.escape(_ID), "[^/]+")


#: ``(regex on the object key, kind)``, first match wins: what object of the layout a key is.
KEY_KINDS: tuple[tuple[re.Pattern[str], str], ...] = tuple((re.compile(rx), kind) for rx, kind in (
    (f"^{_pattern(state_key(_ID))}$", "state"),
    (f"^{_pattern(buffer_key(_ID))}$", "buffer"),
    (f"^{_pattern(group_complete_key(_ID, _ID, _ID))}$", "group"),
    (f"^{_pattern(config_key(_ID))}$", "config"),
    (f"^{_pattern(task_token_key(_ID, _ID))}$", "task_token"),
    (f"^{_pattern(turns_prefix(_ID, _ID))}", "turn"),
    (f"^{_pattern(leases_prefix(_ID))}", "lease"),
    (f"^{_pattern(current_sampler_key(_ID))}$", "sampler"),
    (f"^{_pattern(session_key(_ID))}$", "session"),
    (r"/starts/[^/]+\.json$", "start_marker"),
    (r"/rollouts/", "rollout"),
    (r"/judge/[^/]+\.json$|/judge-progress\.json$|/judge-cache/", "judge"),
    (r"/prompts\.json$", "prompts"),
    (r"/items\.json$", "items"),
    (r"/datums/", "datums"),
    (f"^{_pattern(report_prefix(_ID))}", "report"),
    (r"/summary\.json$", "summary"),
    (r"/evals/[^/]+/results\.json$", "eval_results"),
    (f"^{_pattern(tokenizer_prefix(_ID))}", "tokenizer"),
    (f"^{_pattern(run_prefix(_ID))}dataset/", "dataset"),
    (f"^{_pattern(RESULTS_PREFIX)}", "result"),
    (f"^{_pattern(LEFTOVERS_PREFIX)}", "leftovers"),
))


def key_kind(key: str) -> str:
    """The kind of object ``key`` is (`KEY_KINDS`: "state", "turn", "rollout", ...), or "other"."""
    for rx, kind in KEY_KINDS:
        if rx.search(key):
            return kind
    return "other"
