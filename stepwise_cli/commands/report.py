"""`stepwise report RUN`: the run's report page (one self-contained HTML file).

On the deployed stack the Track function keeps the page at ``runs/{run_id}/report/index.html``
(`stepwise.layout.report_key`), rewritten after every step: by default this prints a presigned URL
of it (``--expires`` seconds, default 3600; the page needs no network once opened);
``--download PATH`` saves it instead. For a local run folder (``runs-local/RUN_ID``) it rebuilds
``runs-local/RUN_ID/report.html`` from the run's objects the folder keeps (``--out`` to write it
elsewhere). ``--rebuild`` rebuilds a deployed run's page from its objects here, into ``--out``
(default ``RUN_ID-report.html``): for a run older than the Track function, or to check it.

``--step N`` (``--eval``: an eval's) is one step's sample table as a page of its own
(``runs/{run_id}/report/steps/{N}.html``, which the run's page links once the step is no longer among
its newest): a presigned URL of it (or ``--download PATH``) on the deployed stack; for a local run
folder (or with ``--rebuild``) the page made from the step's objects, written to ``--out`` (default
``RUN_FOLDER/report-step-N.html`` / ``RUN_ID-step-N.html``).
"""

from __future__ import annotations

import argparse
import json
from datetime import datetime, timezone
from pathlib import Path

from stepwise import layout
from stepwise.views.run import rebuild_page
from stepwise.views.store import Unreadable
from stepwise_cli.commands._runs import EXIT_OK, CommandError, add_stack_arguments
from stepwise_cli.sources import open_run

#: The report page's name in a local run folder.
LOCAL_REPORT = "report.html"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="run id (deployed stack) or a local run folder (runs-local/RUN_ID)")
    from stepwise_cli.grammar import Deprecated, add_json, add_out

    add_out(parser, "the page to this file: a deployed run's page as published (without --out: its presigned URL), "
                    "or the page rebuilt (default: RUN_FOLDER/report.html of a local run, RUN-report.html with --rebuild)",
            type=Path)
    parser.add_argument("--download", dest="out", type=Path, action=Deprecated, new="--out", help=argparse.SUPPRESS)
    parser.add_argument("--expires", type=int, default=3600, help="deployed run: URL lifetime in seconds (default 3600)")
    parser.add_argument("--rebuild", action="store_true", help="rebuild the page here from the run's objects")
    add_json(parser, "{run_id, page} (the file written) or {run_id, url} (a deployed page's presigned URL)")
    parser.add_argument("--step", type=int, help="one step's sample table as a page of its own")
    parser.add_argument("--eval", action="store_true", help="with --step: an eval's table instead of a training step's")
    add_stack_arguments(parser)


def run(args: argparse.Namespace) -> int:
    if args.eval and args.step is None:
        raise CommandError("--eval needs --step N (the eval's step)")
    source = open_run(args.run, args)
    if args.step is not None:
        return _step_page(source, args)
    if source.folder is not None or args.rebuild:
        out = args.out or (source.folder / LOCAL_REPORT if source.folder is not None
                           else Path(f"{source.run_id}-report.html"))
        _check_writable(out, "--out")  # before the page is built (seconds: its charts)
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        try:  # a damaged config.json or state.json is one line naming it, not a traceback
            page = rebuild_page(source.store, source.run_id, updated_at=f"{stamp} (rebuilt by stepwise report)",
                                link_prefix=_link_prefix(source, out))
        except Unreadable as e:
            raise CommandError(str(e)) from None
        _write(out, page.encode("utf-8"), "--out")
        return _done(args, source.run_id, f"report of run {source.run_id}: {out} ({len(page.encode()) / 1024:.0f} KiB)",
                     page=str(out))
    dep = source.deployment
    assert dep is not None
    key = layout.report_key(source.run_id)
    if not _exists(dep, layout.state_key(source.run_id)) or not _exists(dep, key):
        raise CommandError(f"run {source.run_id} has no report page yet (s3://{dep.bucket}/{key}): the Track "
                           "function writes it after the first step; `stepwise report RUN --rebuild` builds it here")
    if args.out:
        _write(args.out, source.store.get_bytes(key), "--out")
        return _done(args, source.run_id, f"report of run {source.run_id}: {args.out}", page=str(args.out))
    url = dep.s3.generate_presigned_url("get_object", Params={"Bucket": dep.bucket, "Key": key},
                                        ExpiresIn=max(1, min(args.expires, 7 * 24 * 3600)))
    return _done(args, source.run_id, url, url=url)


def _done(args: argparse.Namespace, run_id: str, line: str, **data: str) -> int:
    """Print what the command made: ``line``, or with ``--json`` ``{run_id, **data}``."""
    print(json.dumps({"run_id": run_id, **data}) if getattr(args, "json", False) else line)
    return EXIT_OK


def _step_page(source, args: argparse.Namespace) -> int:
    """``--step N``: the step's page (the deployed one's URL, or one made here from the step's objects)."""
    kind = "eval" if args.eval else "train"
    key = layout.report_step_page_key(source.run_id, kind, args.step)
    if source.folder is None and not args.rebuild:
        dep = source.deployment
        assert dep is not None
        if not _exists(dep, key):
            raise CommandError(f"run {source.run_id} has no page for {kind} step {args.step} yet (s3://{dep.bucket}/{key}): "
                               "the Track function writes it when it publishes the step; --rebuild makes it here")
        if args.out:
            _write(args.out, source.store.get_bytes(key), "--out")
            return _done(args, source.run_id, f"{kind} step {args.step} of run {source.run_id}: {args.out}",
                         page=str(args.out))
        url = dep.s3.generate_presigned_url("get_object", Params={"Bucket": dep.bucket, "Key": key},
                                            ExpiresIn=max(1, min(args.expires, 7 * 24 * 3600)))
        return _done(args, source.run_id, url, url=url)
    from stepwise.views.publish import make_table, now_text
    from stepwise.views.page import render_step_page
    from stepwise.views.store import load_tokenizer, read_config, read_json, step_folder, steps_with_rollouts

    name = f"report-{'eval' if args.eval else 'step'}-{args.step}.html"
    out = args.out or (source.folder / name if source.folder is not None else Path(f"{source.run_id}-{name[7:]}"))
    _check_writable(out, "--out")
    if args.step not in steps_with_rollouts(source.store, source.run_id, kind):
        raise CommandError(f"run {source.run_id} has no {kind} rollouts at step {args.step}")
    try:
        cfg = read_config(source.store, source.run_id)
        summary = read_json(source.store, layout.step_summary_key(source.run_id, step_folder(kind), args.step))
    except Unreadable as e:
        raise CommandError(str(e)) from None
    table = source.store.get_json_or(layout.report_table_key(source.run_id, kind, args.step)) or make_table(
        source.store, source.run_id, cfg, kind, args.step, summary, load_tokenizer(source.store, source.run_id))
    page = render_step_page(source.run_id, table, updated_at=f"{now_text()} (rebuilt by stepwise report)")
    _write(out, page.encode("utf-8"), "--out")
    _done(args, source.run_id, f"{kind} step {args.step} of run {source.run_id}: {out} ({len(page.encode()) / 1024:.0f} KiB)",
          page=str(out))
    return EXIT_OK


def _link_prefix(source, out: Path) -> str:
    """Where the page's links to older steps' pages lead from ``out``: the run folder's copy of the
    bucket (``s3/runs/RUN_ID/report/``) for a local run, else nowhere this machine has (the step pages
    are in the bucket beside the deployed page)."""
    if source.folder is None:
        return ""
    import os

    target = source.folder / "s3" / layout.report_prefix(source.run_id)
    return os.path.relpath(target, out.resolve().parent).replace(os.sep, "/") + "/"


def _check_writable(path: Path, flag: str) -> None:
    """CommandError when ``path`` is a folder or its folder cannot be made."""
    if path.is_dir():
        raise CommandError(f"cannot write {flag} {path}: it is a folder (name the page's file, e.g. {path}/report.html)")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CommandError(f"cannot write {flag} {path}: {e.strerror or e}") from None


def _write(path: Path, data: bytes, flag: str) -> None:
    """Write the page to ``path`` (its folder made); CommandError naming the path when it cannot be written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    except OSError as e:
        raise CommandError(f"cannot write {flag} {path}: {e.strerror or e}") from None


def _exists(dep, key: str) -> bool:
    try:
        dep.s3.head_object(Bucket=dep.bucket, Key=key)
        return True
    except Exception:
        return False
