"""Prompt datasets: Parquet or JSONL files whose rows carry an agent ``payload`` object.

Same format as the reference loader (`agentcore_rl_toolkit/backends/experimental/sagemaker/rollout.py
load_dataset`): Parquet with a ``payload`` column (a struct or map column, one JSON object per row), or
JSONL with a ``payload`` field on every line. The file is chosen by its suffix (``.parquet`` /
``.pq`` is Parquet, anything else is JSONL, as the reference). Paths are local or ``s3://bucket/key``.

Unlike the reference, every malformed input raises a `DatasetError` that names the file and the
row or line, so bad data is caught by Init / `stepwise validate` before a billed session starts.

S3 objects are read by `stepwise.aws.datasets`; everything else here is parsing and validation.
Memory does not grow with the file: `iter_payloads` streams it (JSONL line by line from a chunked
read; Parquet batch by batch from ranged reads of only the ``payload`` column), so Init can validate a
dataset of any size within its Lambda's memory. `shard_dataset` also writes the payloads once as
JSONL *shards* of about `SHARD_BYTES` each (Init puts them under the run's prefix,
``stepwise.layout.dataset_shard_key``), and `read_rows` then reads only the shards holding the rows
a generation batch needs (PlanStep).
"""

from __future__ import annotations

import bisect
import codecs
import io
import json
import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict

# The error is defined where datasets are first read (the S3 boundary raises it too); importing it from here
# is what every caller does. This module reads S3 through that boundary; it never imports back.
from stepwise.aws.datasets import DatasetError, open_object

__all__ = ["DatasetError", "DatasetIndex", "iter_payloads", "load_payloads", "check_dataset", "shard_dataset",
           "read_rows", "PAYLOAD_COLUMN", "SHARD_BYTES"]

PAYLOAD_COLUMN = "payload"
PARQUET_SUFFIXES = (".parquet", ".pq")
#: Target size of one shard (whole rows; a larger row gets a shard of its own). A batch of 32
#: ~1 KB prompts then reads one or two 1 MiB objects; a 600 MB dataset is ~600 PUTs in Init.
SHARD_BYTES = 1 << 20
#: Bytes per read of a JSONL stream, and per ranged GET / Arrow buffer of a Parquet file.
READ_CHUNK = 1 << 20
#: The longest JSONL line read: InvokeAgentRuntime's payload limit (botocore model bedrock-agentcore,
#: InvokeAgentRuntime ``payload``: 100,000,000 bytes) plus 1 MiB for the row's other fields. A longer
#: line holds a payload no agent can be invoked with (or the file is one JSON document, not JSONL).
MAX_LINE_BYTES = 100_000_000 + (1 << 20)
#: Rows per Arrow record batch when streaming Parquet.
PARQUET_BATCH_ROWS = 1024


def _is_parquet(path: str) -> bool:
    return path.lower().endswith(PARQUET_SUFFIXES)


def _open(path: str, s3_client: Any | None, *, seekable: bool) -> BinaryIO:
    """A binary stream of ``path``: a local file, or an S3 object (`stepwise.aws.datasets.open_object`)."""
    if path.startswith("s3://"):
        return open_object(path, s3_client, seekable=seekable, chunk=READ_CHUNK)
    try:
        return open(path, "rb")
    except OSError as e:
        raise DatasetError(f"{path}: cannot read ({e.strerror or e})") from e


def _lines(stream: BinaryIO, path: str) -> Iterator[bytes]:
    """The ``\n``-separated lines of ``stream``, read ``READ_CHUNK`` bytes at a time (JSONL's only separator:
    unlike ``str.splitlines``, a U+2028 inside a JSON string does not split a row). Each chunk is scanned
    once, so a long line costs its length, not its length squared.

    Raises:
        DatasetError: a line longer than `MAX_LINE_BYTES`.
    """
    parts: list[bytes] = []
    size = lineno = 0
    while chunk := stream.read(READ_CHUNK):
        start = 0
        while (end := chunk.find(b"\n", start)) != -1:
            parts.append(chunk[start:end])
            lineno += 1
            yield b"".join(parts)
            parts, size, start = [], 0, end + 1
        if start < len(chunk):
            parts.append(chunk[start:])
            size += len(chunk) - start
            if size > MAX_LINE_BYTES:
                raise DatasetError(
                    f"{path}:{lineno + 1}: line longer than {MAX_LINE_BYTES:,} bytes: more than an InvokeAgentRuntime "
                    "payload can hold (JSONL expected: one row per line; name Parquet files *.parquet)")
    if parts:
        yield b"".join(parts)


def _not_a_json_number(text: str) -> float:
    raise ValueError(f"{text} is not a JSON number (the payload is sent to the agent as JSON)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} overflows a float (the payload is sent to the agent as JSON)")
    return value


def _jsonl_payloads(path: str, stream: BinaryIO) -> Iterator[Any]:
    for lineno, raw in enumerate(_lines(stream, path), start=1):
        if lineno == 1 and raw.startswith(codecs.BOM_UTF8):  # what Windows editors put before the first row
            raw = raw[len(codecs.BOM_UTF8):]
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DatasetError(
                f"{path}:{lineno}: not UTF-8 text (JSONL expected; name Parquet files *.parquet): {e}") from e
        if not line.strip():
            continue
        try:
            row = json.loads(line, parse_constant=_not_a_json_number, parse_float=_finite_float)
        except json.JSONDecodeError as e:
            raise DatasetError(f"{path}:{lineno}: not valid JSON ({e.msg} at column {e.colno})") from e
        except RecursionError:
            raise DatasetError(f"{path}:{lineno}: values nested too deeply to read") from None
        except ValueError as e:  # NaN/Infinity, a float beyond 1e308, an int of more than 4300 digits
            raise DatasetError(f"{path}:{lineno}: not usable JSON ({e})") from None
        if not isinstance(row, dict) or PAYLOAD_COLUMN not in row:
            raise DatasetError(f"{path}:{lineno}: line must be an object with a '{PAYLOAD_COLUMN}' field")
        if not isinstance(row[PAYLOAD_COLUMN], dict):
            raise DatasetError(f"{path}:{lineno}: {_not_object(row[PAYLOAD_COLUMN])}")
        yield row[PAYLOAD_COLUMN]


def _parquet_payloads(path: str, stream: BinaryIO) -> Iterator[Any]:
    def unreadable(e: Exception) -> DatasetError:
        return DatasetError(f"{path}: not a readable Parquet file ({e})")

    try:
        # buffer_size > 0: column chunks are read page by page, not whole (a row group can be 1Mi rows).
        pf = pq.ParquetFile(stream, buffer_size=READ_CHUNK, pre_buffer=False)
        names = pf.schema_arrow.names
    except (pa.ArrowException, OSError) as e:
        raise unreadable(e) from e
    if PAYLOAD_COLUMN not in names:
        raise DatasetError(
            f"{path}: no '{PAYLOAD_COLUMN}' column (columns: {names}); "
            "each row needs a payload object (see prepare_datasets/)"
        )
    is_map = pa.types.is_map(pf.schema_arrow.field(PAYLOAD_COLUMN).type)
    row = 0
    batches = pf.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=[PAYLOAD_COLUMN])
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except (pa.ArrowException, OSError) as e:
            raise unreadable(e) from e
        for value in batch.column(0).to_pylist():
            if is_map and value is not None:  # map<string, T> comes back as [(key, value), ...]
                value = dict(value)
            if not isinstance(value, dict):
                raise DatasetError(f"{path}: row {row} (0-based): {_not_object(value)}")
            try:  # Parquet types JSON has no form for: the payload is sent to the agent as JSON
                json.dumps(value, allow_nan=False)
            except (TypeError, ValueError) as e:
                raise DatasetError(f"{path}: row {row} (0-based): the payload is not JSON data ({e}); cast "
                                   "timestamp/binary/decimal fields to strings, replace NaN/Infinity") from None
            row += 1
            yield value


def _not_object(value: Any) -> str:
    return f"payload must be a JSON object, got {type(value).__name__} {str(value)[:60]!r}"


def iter_payloads(path: str, *, s3_client: Any | None = None) -> Iterator[dict[str, Any]]:
    """Stream every row's payload, in file order, holding one chunk / record batch at a time.

    Args:
        path: local path or ``s3://bucket/key`` of a ``.parquet`` file or a JSONL file.
        s3_client: a boto3 S3 client for ``s3://`` paths (default: ``boto3.client("s3")``).

    Yields:
        One dict per row: the payload the agent is invoked with.

    Raises:
        DatasetError: unreadable or missing file, not Parquet/JSON, no ``payload`` column/field, a
            payload that is not an object (names the 0-based Parquet row or the 1-based JSONL line).
            An empty file yields nothing (`check_dataset` refuses it).
    """
    parquet = _is_parquet(path)
    stream = _open(path, s3_client, seekable=parquet)
    try:
        yield from (_parquet_payloads if parquet else _jsonl_payloads)(path, stream)
    finally:
        stream.close()


def _no_rows(path: str) -> DatasetError:
    return DatasetError(f"{path}: no rows (an empty dataset cannot train or evaluate)")


def load_payloads(path: str, *, s3_client: Any | None = None) -> list[dict[str, Any]]:
    """Every row's payload as a list (`iter_payloads` for datasets that may not fit in memory).

    Raises:
        DatasetError: as `iter_payloads`, or no rows.
    """
    payloads = list(iter_payloads(path, s3_client=s3_client))
    if not payloads:
        raise _no_rows(path)
    return payloads


def _shards(payloads: Iterable[dict[str, Any]], shard_bytes: int) -> Iterator[tuple[int, bytes]]:
    """``(rows, body)`` per shard: payloads as JSONL, cut after the row that reaches ``shard_bytes``."""
    lines: list[bytes] = []
    size = 0
    for payload in payloads:
        line = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
        lines.append(line)
        size += len(line)
        if size >= shard_bytes:
            yield len(lines), b"".join(lines)
            lines, size = [], 0
    if lines:
        yield len(lines), b"".join(lines)


class DatasetIndex(BaseModel):
    """``runs/{run_id}/dataset/{kind}/index.json``: where each shard of a run's dataset snapshot starts.

    ``shard_starts[i]`` is the 0-based row shard i begins with (ascending; shard i holds rows up to
    ``shard_starts[i + 1]``, the last one up to ``rows``). Written once by Init (`shard_dataset`).
    """

    model_config = ConfigDict(extra="forbid")

    source: str  # the dataset path the shards were read from
    rows: int
    shard_starts: list[int]


def _require_rows(path: str, rows: int, min_rows: int) -> int:
    if rows == 0:
        raise _no_rows(path)
    if rows < min_rows:
        raise DatasetError(f"{path}: {rows} rows, need at least {min_rows} (batch_size)")
    return rows


def check_dataset(path: str, min_rows: int, *, s3_client: Any | None = None) -> int:
    """Stream ``path`` and require at least ``min_rows`` valid payload rows; return the row count.

    Used by ``stepwise validate --check-datasets`` (Init uses `shard_dataset`, which checks the same).

    Raises:
        DatasetError: as `iter_payloads`, no rows, or fewer than ``min_rows`` rows.
    """
    return _require_rows(path, sum(1 for _ in iter_payloads(path, s3_client=s3_client)), min_rows)


def shard_dataset(path: str, min_rows: int, put_shard: Callable[[int, bytes], None], *,
                  s3_client: Any | None = None, shard_bytes: int = SHARD_BYTES) -> DatasetIndex:
    """`check_dataset`, and write the payloads once as JSONL shards while streaming them.

    Args:
        put_shard: ``put_shard(i, body)`` for shard i = 0, 1, ...: one payload object per line,
            about ``shard_bytes`` each (Init: a PutObject of ``stepwise.layout.dataset_shard_key``).

    Raises:
        DatasetError: as `check_dataset` (shards already written stay; a retried Init rewrites them).
    """
    rows, starts = 0, []
    for i, (n, body) in enumerate(_shards(iter_payloads(path, s3_client=s3_client), shard_bytes)):
        put_shard(i, body)
        starts.append(rows)
        rows += n
    return DatasetIndex(source=path, rows=_require_rows(path, rows, min_rows), shard_starts=starts)


def read_rows(rows: Iterable[int], index: DatasetIndex, get_shard: Callable[[int], bytes]) -> dict[int, dict[str, Any]]:
    """``{row: payload}`` for ``rows``, reading only the shards that hold them (each once).

    Args:
        rows: 0-based row numbers, each < ``index.rows``.
        index: the snapshot's `DatasetIndex`.
        get_shard: shard number -> its bytes (a GetObject of ``stepwise.layout.dataset_shard_key``).

    Raises:
        IndexError: a row outside the dataset.
    """
    shard_starts = index.shard_starts
    wanted: dict[int, list[int]] = {}
    for r in rows:
        if not 0 <= r < index.rows:
            raise IndexError(f"row {r} is not in the dataset")
        wanted.setdefault(bisect.bisect_right(shard_starts, r) - 1, []).append(r)
    out: dict[int, dict[str, Any]] = {}
    for shard, shard_rows in sorted(wanted.items()):
        lines = get_shard(shard).split(b"\n")
        for r in shard_rows:
            i = r - shard_starts[shard]
            if i >= len(lines) or not lines[i]:
                raise IndexError(f"row {r} is not in the dataset (shard {shard} holds {len(lines) - 1} rows)")
            out[r] = json.loads(lines[i])
    return out


def payloads_to_parquet_bytes(payloads: list[dict[str, Any]]) -> bytes:
    """Write payloads as a one-column (``payload``, struct) Parquet file, the reference's layout."""
    buf = io.BytesIO()
    pq.write_table(pa.table({PAYLOAD_COLUMN: pa.array(payloads)}), buf)
    return buf.getvalue()
