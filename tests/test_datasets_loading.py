"""load_payloads / check_dataset: Parquet and JSONL, local and S3 (moto), and every failure's message."""

from __future__ import annotations

import json

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from moto import mock_aws

from stepwise.datasets import DatasetError, check_dataset, load_payloads, payloads_to_parquet_bytes

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
