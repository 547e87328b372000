"""load_payloads / check_dataset: Parquet and JSONL, local and S3 (moto), and every failure's message."""

from __future__ import annotations

import json

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from moto import mock_aws

from stepwise.datasets import (
    DatasetError,
    check_dataset,
    iter_payloads,
    load_payloads,
    payloads_to_parquet_bytes,
    read_rows,
    shard_dataset,
)

PAYLOADS = [{"prompt": "1+1?", "answer": "2"}, {"prompt": "2+2?", "answer": "4"}, {"prompt": "3+3?", "answer": "6"}]


def write_jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(path)


def test_parquet_and_jsonl_give_the_same_payloads_in_order(tmp_path):
    pq_path = tmp_path / "d.parquet"
    pq_path.write_bytes(payloads_to_parquet_bytes(PAYLOADS))
    jl = write_jsonl(tmp_path / "d.jsonl", [{"payload": p, "extra": 1} for p in PAYLOADS])
    assert load_payloads(str(pq_path)) == PAYLOADS == load_payloads(jl)
    assert check_dataset(str(pq_path), 3) == 3


def test_map_typed_payload_column_reads_as_dicts(tmp_path):
    path = tmp_path / "m.parquet"
    col = pa.array([[("prompt", "a")], [("prompt", "b")]], type=pa.map_(pa.string(), pa.string()))
    pq.write_table(pa.table({"payload": col}), path)
    assert load_payloads(str(path)) == [{"prompt": "a"}, {"prompt": "b"}]


def test_s3_path_reads_through_the_given_client(tmp_path):
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="data-bkt")
        s3.put_object(Bucket="data-bkt", Key="sets/train.parquet", Body=payloads_to_parquet_bytes(PAYLOADS))
        s3.put_object(Bucket="data-bkt", Key="sets/train.jsonl", Body=b'{"payload": {"q": 1}}\n')
        assert load_payloads("s3://data-bkt/sets/train.parquet", s3_client=s3) == PAYLOADS
        assert load_payloads("s3://data-bkt/sets/train.jsonl", s3_client=s3) == [{"q": 1}]
        with pytest.raises(DatasetError, match=r"s3://data-bkt/sets/missing.parquet: cannot read from S3 \(NoSuchKey\)"):
            load_payloads("s3://data-bkt/sets/missing.parquet", s3_client=s3)


def test_missing_column(tmp_path):
    path = tmp_path / "nocol.parquet"
    pq.write_table(pa.table({"prompt": ["a"]}), path)
    with pytest.raises(DatasetError, match=r"no 'payload' column \(columns: \['prompt'\]\)"):
        load_payloads(str(path))
    jl = write_jsonl(tmp_path / "nofield.jsonl", [{"payload": {"a": 1}}, {"prompt": "x"}])
    with pytest.raises(DatasetError, match=r"nofield.jsonl:2: line must be an object with a 'payload' field"):
        load_payloads(jl)


def test_non_object_payload_names_the_row(tmp_path):
    path = tmp_path / "str.parquet"
    pq.write_table(pa.table({"payload": ["ok?", "no"]}), path)
    with pytest.raises(DatasetError, match=r"str.parquet: row 0 \(0-based\): payload must be a JSON object, got str"):
        load_payloads(str(path))
    jl = write_jsonl(tmp_path / "list.jsonl", [{"payload": {"a": 1}}, {"payload": {"a": 2}}, {"payload": [1, 2]}])
    with pytest.raises(DatasetError, match=r"list.jsonl:3: payload must be a JSON object, got list"):
        load_payloads(jl)


def test_bad_json_line_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"payload": {"a": 1}}\n\n{"payload": oops}\n')
    with pytest.raises(DatasetError, match=r"bad.jsonl:3: not valid JSON"):
        load_payloads(str(path))


def test_empty_unreadable_and_too_small(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n \n")
    with pytest.raises(DatasetError, match="empty.jsonl: no rows"):
        load_payloads(str(empty))
    empty_pq = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"payload": pa.array([], type=pa.struct([("a", pa.int64())]))}), empty_pq)
    with pytest.raises(DatasetError, match="no rows"):
        load_payloads(str(empty_pq))
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"not parquet at all")
    with pytest.raises(DatasetError, match="garbage.parquet: not a readable Parquet file"):
        load_payloads(str(garbage))
    with pytest.raises(DatasetError, match=r"nope.jsonl: cannot read"):
        load_payloads(str(tmp_path / "nope.jsonl"))
    ok = write_jsonl(tmp_path / "two.jsonl", [{"payload": p} for p in PAYLOADS[:2]])
    with pytest.raises(DatasetError, match=r"two.jsonl: 2 rows, need at least 32 \(batch_size\)"):
        check_dataset(ok, 32)


def test_a_json_line_separator_inside_a_string_does_not_split_a_row(tmp_path):
    path = tmp_path / "u2028.jsonl"
    path.write_text(json.dumps({"payload": {"q": "a\u2028b\u0085c"}}, ensure_ascii=False) + "\n", encoding="utf-8")
    assert load_payloads(str(path)) == [{"q": "a\u2028b\u0085c"}]


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_shards_hold_every_row_once_and_read_rows_fetches_only_the_shards_needed(tmp_path, fmt):
    rows = [{"i": i, "text": "x" * (i % 97)} for i in range(500)]
    if fmt == "parquet":
        path = tmp_path / "d.parquet"
        path.write_bytes(payloads_to_parquet_bytes(rows))
    else:
        path = tmp_path / "d.jsonl"
        write_jsonl(path, [{"payload": r} for r in rows])
    shards: dict[int, bytes] = {}
    index = shard_dataset(str(path), 10, shards.__setitem__, shard_bytes=2_000)
    assert index.rows == 500 and len(index.shard_starts) == len(shards) > 10
    assert index.shard_starts == sorted(index.shard_starts) and index.shard_starts[0] == 0
    assert all(len(body) < 2_000 + 200 for body in shards.values())
    fetched: list[int] = []

    def get(i: int) -> bytes:
        fetched.append(i)
        return shards[i]

    wanted = list(range(250, 262))
    assert read_rows(wanted, index, get) == {r: rows[r] for r in wanted}
    assert len(fetched) == len(set(fetched)) <= 2
    assert read_rows(range(500), index, shards.__getitem__) == dict(enumerate(rows))
    with pytest.raises(IndexError, match="row 500"):
        read_rows([500], index, get)
    with pytest.raises(DatasetError, match="need at least 501"):
        shard_dataset(str(path), 501, lambda i, b: None)


def test_parquet_on_s3_is_read_in_ranges_of_the_payload_column_only(tmp_path):
    import random

    rng = random.Random(0)
    rows = [{"i": i, "pad": "y" * 200} for i in range(20_000)]
    pq_path = tmp_path / "two.parquet"
    other = [rng.randbytes(250).hex() for _ in rows]  # incompressible: most of the file's bytes
    pq.write_table(pa.table({"payload": pa.array(rows), "other": other}), pq_path)
    size = pq_path.stat().st_size
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="data-bkt")
        s3.put_object(Bucket="data-bkt", Key="p.parquet", Body=pq_path.read_bytes())
        s3.put_object(Bucket="data-bkt", Key="empty.parquet", Body=b"")
        ranges: list[str | None] = []
        got = {"bytes": 0}
        s3.meta.events.register("provide-client-params.s3.GetObject",
                                lambda params, **_: ranges.append(params.get("Range")))
        s3.meta.events.register("after-call.s3.GetObject",
                                lambda parsed, **_: got.__setitem__("bytes", got["bytes"] + parsed["ContentLength"]))
        assert [p["i"] for p in iter_payloads("s3://data-bkt/p.parquet", s3_client=s3)] == list(range(20_000))
        assert ranges and all(r and r.startswith("bytes=") for r in ranges)  # never the whole object
        assert got["bytes"] < size / 2, (got, size)  # the "other" column is never read
        with pytest.raises(DatasetError, match="empty.parquet: not a readable Parquet file"):
            load_payloads("s3://data-bkt/empty.parquet", s3_client=s3)
