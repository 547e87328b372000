"""Reading dataset objects from S3: one GetObject stream, or ranged GETs for Parquet.

`stepwise.datasets` parses and validates what these streams hold (it imports this module, never the other
way round); errors here and there are `DatasetError` (defined here, where a dataset is first read, and
imported by every caller from `stepwise.datasets`), naming the ``s3://`` path.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any, BinaryIO

from stepwise.layout import dataset_shard_key

class DatasetError(ValueError):
    """A dataset cannot be used; the message names the file and, where it applies, the row or line."""


#: What the first ranged GET of a Parquet object reads from its end (its footer, usually all of it).
TAIL_BYTES = 1 << 20


def _s3_location(path: str) -> tuple[str, str]:
    bucket, _, key = path[len("s3://"):].partition("/")
    if not bucket or not key:
        raise DatasetError(f"{path}: expected s3://bucket/key")
    return bucket, key


def _s3_error(path: str, e: Exception) -> DatasetError:
    code = getattr(e, "response", {}).get("Error", {}).get("Code", type(e).__name__)
    return DatasetError(f"{path}: cannot read from S3 ({code}): {e}")


class S3ObjectFile(io.RawIOBase):
    """A seekable, read-only file over one S3 object: each ``readinto`` is one ranged GetObject.

    For Parquet, whose reader reads the footer at the end and then the column chunks it needs. The
    first GET asks for the object's last ``tail_bytes`` (a suffix range, which also gives the size)
    and keeps them, so opening a file costs one request. Errors are `DatasetError` naming ``path``.
    """

    def __init__(self, s3_client: Any, bucket: str, key: str, path: str, *, tail_bytes: int = TAIL_BYTES) -> None:
        self._s3, self._bucket, self._key, self._path = s3_client, bucket, key, path
        self._pos = 0
        try:
            resp = s3_client.get_object(Bucket=bucket, Key=key, Range=f"bytes=-{tail_bytes}")
        except Exception as e:  # NoSuchKey / NoSuchBucket / AccessDenied / endpoint errors
            if getattr(e, "response", {}).get("Error", {}).get("Code") == "InvalidRange":  # an empty object
                self.size, self._tail = 0, b""
                return
            raise _s3_error(path, e) from e
        self._tail = resp["Body"].read()
        content_range = resp.get("ContentRange") or ""
        self.size = int(content_range.rpartition("/")[2]) if "/" in content_range else len(self._tail)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        n = min(len(buffer), self.size - self._pos)
        if n <= 0:
            return 0
        tail_start = self.size - len(self._tail)
        if self._pos >= tail_start:
            body = self._tail[self._pos - tail_start: self._pos - tail_start + n]
        else:
            try:
                body = self._s3.get_object(Bucket=self._bucket, Key=self._key,
                                           Range=f"bytes={self._pos}-{self._pos + n - 1}")["Body"].read()
            except Exception as e:
                raise _s3_error(self._path, e) from e
        buffer[: len(body)] = body
        self._pos += len(body)
        return len(body)


def open_object(path: str, s3_client: Any | None, *, seekable: bool, chunk: int) -> BinaryIO:
    """A binary stream of the ``s3://`` object ``path``: its GetObject body, or (``seekable``, for
    Parquet) ranged GETs of ``chunk`` bytes (`S3ObjectFile`). ``s3_client`` None = ``boto3.client("s3")``.
    Raises DatasetError naming ``path``."""
    bucket, key = _s3_location(path)
    if s3_client is None:
        import boto3

        s3_client = boto3.client("s3")
    if seekable:
        return io.BufferedReader(S3ObjectFile(s3_client, bucket, key, path), buffer_size=chunk)  # type: ignore[return-value]
    try:
        return s3_client.get_object(Bucket=bucket, Key=key)["Body"]
    except Exception as e:  # botocore ClientError / NoSuchKey / NoSuchBucket / endpoint errors
        raise _s3_error(path, e) from e


def shard_reader(s3_client: Any, bucket: str, run_id: str, kind: str) -> Callable[[int], bytes]:
    """shard number -> the bytes of the run's ``kind`` dataset snapshot shard (`stepwise.layout.dataset_shard_key`),
    one GetObject each (`stepwise.datasets.read_rows` calls it for the shards a batch needs)."""
    def read(shard: int) -> bytes:
        return s3_client.get_object(Bucket=bucket, Key=dataset_shard_key(run_id, kind, shard))["Body"].read()

    return read
