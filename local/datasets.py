"""run-local's datasets: the files a config names, generated on first use, and their upload to moto's S3.

``DATASET_GENERATORS`` maps a dataset file name to what makes it (the toy task's rows, GSM8K's
split from ``STEPWISE_GSM8K_DIR``: `prepare_datasets.prepare_gsm8k.source_file`); ``upload_datasets`` points the config at ``s3://`` copies, as a
user does before starting an execution on AWS.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from local import REPO_ROOT
from stepwise import layout


def _gen_toy(rows: int, seed: int) -> Callable[[Path], None]:
    def gen(path: Path) -> None:
        from prepare_datasets.prepare_toy import write_rows

        write_rows(path, rows, seed)

    return gen


def _gen_toy_unlabelled(rows: int, seed: int) -> Callable[[Path], None]:
    def gen(path: Path) -> None:
        from prepare_datasets.prepare_toy import write_unlabelled_rows

        write_unlabelled_rows(path, rows, seed)

    return gen


def _gen_mix(rows: int, seed: int) -> Callable[[Path], None]:
    def gen(path: Path) -> None:
        from prepare_datasets.prepare_mix import write_rows

        write_rows(path, rows, seed)

    return gen


def _gen_two_turn(rows: int, seed: int) -> Callable[[Path], None]:
    def gen(path: Path) -> None:
        from prepare_datasets.prepare_two_turn import write_rows

        write_rows(path, rows, seed)

    return gen


def _gen_gsm8k(split: str) -> Callable[[Path], None]:
    def gen(path: Path) -> None:
        from prepare_datasets.prepare_gsm8k import gsm8k_rows, source_file, write_rows

        write_rows(gsm8k_rows(source_file(split)), path)

    return gen


#: Dataset file name -> how to make it when the config names it and it does not exist yet.
DATASET_GENERATORS: dict[str, Callable[[Path], None]] = {
    "toy_train.jsonl": _gen_toy(rows=200, seed=0),
    "toy_eval.jsonl": _gen_toy(rows=10, seed=1),
    "toy_small.jsonl": _gen_toy(rows=40, seed=2),
    "toy_judge_train.jsonl": _gen_toy_unlabelled(rows=200, seed=0),
    "two_turn_train.jsonl": _gen_two_turn(rows=200, seed=0),
    "two_turn_eval.jsonl": _gen_two_turn(rows=10, seed=1),
    "mix_train.jsonl": _gen_mix(rows=240, seed=0),
    "mix_eval.jsonl": _gen_mix(rows=30, seed=1),
    "gsm8k_test.jsonl": _gen_gsm8k("test"),
    "gsm8k_train.jsonl": _gen_gsm8k("train"),
}


def resolve_dataset(path_str: str, config_dir: Path) -> Path:
    """A local dataset path (relative to the repo, then the config's folder); generated if a
    known generator makes it. Raises FileNotFoundError naming what was tried."""
    path = Path(path_str)
    candidates = [path] if path.is_absolute() else [REPO_ROOT / path, config_dir / path, Path.cwd() / path]
    for c in candidates:
        if c.is_file():
            return c
    gen = DATASET_GENERATORS.get(path.name)
    if gen is None:
        raise FileNotFoundError(f"dataset {path_str!r} not found (tried {[str(c) for c in candidates]}) and no "
                                f"generator for {path.name!r}; known: {sorted(DATASET_GENERATORS)}")
    target = candidates[0]
    target.parent.mkdir(parents=True, exist_ok=True)
    gen(target)
    return target


def upload_datasets(cfg: dict[str, Any], *, s3: Any, bucket: str, run_id: str, config_dir: Path) -> dict[str, Any]:
    """Copy local dataset files to ``s3://bucket/datasets/{run_id}/`` and point the config at
    them (as a user does before starting an execution on AWS). ``s3://`` paths are kept."""
    out = dict(cfg)

    def upload(value: Any, prefix: str = "") -> Any:
        if not value or str(value).startswith("s3://"):
            return value
        local = resolve_dataset(str(value), config_dir)
        s3_key = layout.upload_key(run_id, prefix + local.name)
        s3.upload_file(str(local), bucket, s3_key)
        return f"s3://{bucket}/{s3_key}"

    for key in ("dataset_path", "eval_dataset_path"):
        if key in out:
            out[key] = upload(out[key])
    if out.get("eval_datasets"):  # named eval sets: the name keeps two sets' equal file names apart
        out["eval_datasets"] = {name: upload(path, f"eval-{name}-") for name, path in out["eval_datasets"].items()}
    return out


def planned_steps(config: Any, s3: Any, bucket: str, run_cfg: dict[str, Any]) -> int | None:
    """The run's train steps (steps per epoch of the uploaded train set x epochs, at most ``max_steps``),
    for the progress bar's total and the cost estimate; None when the dataset cannot be read."""
    try:
        from stepwise.datasets import load_payloads

        rows = len(load_payloads(run_cfg["dataset_path"], s3_client=s3))
        return config.total_steps(rows)
    except Exception:
        return None
