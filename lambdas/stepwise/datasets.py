"""Prompt datasets: Parquet or JSONL files whose rows carry an agent ``payload`` object.

Same format as the reference loader (`agentcore_rl_toolkit/backends/experimental/sagemaker/rollout.py
load_dataset`): Parquet with a ``payload`` column (a struct or map column, one JSON object per row), or
JSONL with a ``payload`` field on every line. The file is chosen by its suffix (``.parquet`` /
``.pq`` is Parquet, anything else is JSONL, as the reference). Paths are local or ``s3://bucket/key``.

Unlike the reference, every malformed input raises a `DatasetError` that names the file and the
row or line, so bad data is caught by Init / `stepwise validate` before a billed session starts.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["DatasetError", "load_payloads", "check_dataset", "PAYLOAD_COLUMN"]

PAYLOAD_COLUMN = "payload"
PARQUET_SUFFIXES = (".parquet", ".pq")


class DatasetError(ValueError):
    """A dataset cannot be used; the message names the file and, where it applies, the row or line."""


def _is_parquet(path: str) -> bool:
    return path.lower().endswith(PARQUET_SUFFIXES)


def _read_bytes(path: str, s3_client: Any | None) -> bytes:
    if path.startswith("s3://"):
        bucket, _, key = path[len("s3://"):].partition("/")
        if not bucket or not key:
            raise DatasetError(f"{path}: expected s3://bucket/key")
        if s3_client is None:
            import boto3

            s3_client = boto3.client("s3")
        try:
            return s3_client.get_object(Bucket=bucket, Key=key)["Body"].read()
        except Exception as e:  # botocore ClientError / NoSuchKey / NoSuchBucket / endpoint errors
            code = getattr(e, "response", {}).get("Error", {}).get("Code", type(e).__name__)
            raise DatasetError(f"{path}: cannot read from S3 ({code}): {e}") from e
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise DatasetError(f"{path}: cannot read ({e.strerror or e})") from e


def _parquet_payloads(path: str, data: bytes) -> list[Any]:
    try:
        table = pq.read_table(pa.BufferReader(data))
    except (pa.ArrowException, OSError) as e:
        raise DatasetError(f"{path}: not a readable Parquet file ({e})") from e
    if PAYLOAD_COLUMN not in table.column_names:
        raise DatasetError(
            f"{path}: no '{PAYLOAD_COLUMN}' column (columns: {table.column_names}); "
            "each row needs a payload object (see prepare_datasets/)"
        )
    column = table.column(PAYLOAD_COLUMN)
    values = column.to_pylist()
    if pa.types.is_map(column.type):  # map<string, T> comes back as [(key, value), ...]
        values = [dict(v) if v is not None else None for v in values]
    return values


def _jsonl_payloads(path: str, data: bytes) -> list[Any]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DatasetError(f"{path}: not UTF-8 text (JSONL expected; name Parquet files *.parquet): {e}") from e
    payloads: list[Any] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DatasetError(f"{path}:{lineno}: not valid JSON ({e.msg} at column {e.colno})") from e
        if not isinstance(row, dict) or PAYLOAD_COLUMN not in row:
            raise DatasetError(f"{path}:{lineno}: line must be an object with a '{PAYLOAD_COLUMN}' field")
        if not isinstance(row[PAYLOAD_COLUMN], dict):
            raise DatasetError(f"{path}:{lineno}: {_not_object(row[PAYLOAD_COLUMN])}")
        payloads.append(row[PAYLOAD_COLUMN])
    return payloads


def _not_object(value: Any) -> str:
    return f"payload must be a JSON object, got {type(value).__name__} {str(value)[:60]!r}"


def load_payloads(path: str, *, s3_client: Any | None = None) -> list[dict[str, Any]]:
    """Read every row's payload, in file order.

    Args:
        path: local path or ``s3://bucket/key`` of a ``.parquet`` file or a JSONL file.
        s3_client: a boto3 S3 client for ``s3://`` paths (default: ``boto3.client("s3")``).

    Returns:
        One dict per row: the payload the agent is invoked with.

    Raises:
        DatasetError: unreadable or missing file, not Parquet/JSON, no ``payload`` column/field, a
            payload that is not an object (names the 0-based Parquet row or the 1-based JSONL line),
            or no rows.
    """
    data = _read_bytes(path, s3_client)
    if _is_parquet(path):
        payloads = _parquet_payloads(path, data)
        for i, p in enumerate(payloads):
            if not isinstance(p, dict):
                raise DatasetError(f"{path}: row {i} (0-based): {_not_object(p)}")
    else:
        payloads = _jsonl_payloads(path, data)
    if not payloads:
        raise DatasetError(f"{path}: no rows (an empty dataset cannot train or evaluate)")
    return payloads


def check_dataset(path: str, min_rows: int, *, s3_client: Any | None = None) -> int:
    """Load ``path`` and require at least ``min_rows`` valid payload rows; return the row count.

    Used before a billed session is created (Init) and by ``stepwise validate --check-datasets``.

    Raises:
        DatasetError: as `load_payloads`, or fewer than ``min_rows`` rows.
    """
    rows = len(load_payloads(path, s3_client=s3_client))
    if rows < min_rows:
        raise DatasetError(f"{path}: {rows} rows, need at least {min_rows} (batch_size)")
    return rows


def payloads_to_parquet_bytes(payloads: list[dict[str, Any]]) -> bytes:
    """Write payloads as a one-column (``payload``, struct) Parquet file, the reference's layout."""
    buf = io.BytesIO()
    pq.write_table(pa.table({PAYLOAD_COLUMN: pa.array(payloads)}), buf)
    return buf.getvalue()
