"""Hostile JSONL datasets: whatever the lines hold, `check_dataset` (what `stepwise validate
--check-datasets` and Init run) counts the rows or raises a DatasetError naming the file and line,
never another exception; a payload that is not strict JSON (NaN, Infinity) is refused, because it
reaches the agent as its invocation payload. Hypothesis writes arbitrary lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stepwise.datasets import DatasetError, check_dataset, iter_payloads


def _write(tmp_path: Path, data: bytes) -> str:
    path = tmp_path / "train.jsonl"
    path.write_bytes(data)
    return str(path)


@pytest.mark.parametrize("line, fragment", [
    pytest.param(b'{"payload": {"n": ' + b"9" * 5000 + b"}}", "digits", id="int-of-5000-digits"),
    pytest.param(b'{"payload": {"n": ' + b"[" * 5000 + b"]" * 5000 + b"}}", "nested", id="nested-5000-deep"),
    pytest.param(b'{"payload": {"n": NaN}}', "NaN", id="NaN"),
    pytest.param(b'{"payload": {"n": -Infinity}}', "-Infinity", id="-Infinity"),
    pytest.param(b'{"payload": {"n": 1e999}}', "1e999", id="float-overflowing-to-inf"),
])
def test_a_line_json_cannot_use_is_a_dataset_error_naming_the_line(tmp_path, line, fragment):
    path = _write(tmp_path, b'{"payload": {"prompt": "ok"}}\n' + line + b"\n")
    with pytest.raises(DatasetError) as e:
        check_dataset(path, 1)
    assert f"{path}:2: " in str(e.value) and fragment in str(e.value), str(e.value)


def test_a_utf8_byte_order_mark_is_not_part_of_the_first_row(tmp_path):
    # What Windows editors write at the start of a UTF-8 file.
    path = _write(tmp_path, b'\xef\xbb\xbf{"payload": {"prompt": "a"}}\r\n{"payload": {"prompt": "b"}}\r\n')
    assert check_dataset(path, 2) == 2
    assert [p["prompt"] for p in iter_payloads(path)] == ["a", "b"]


_LINE = st.one_of(
    st.binary(max_size=40),
    st.text(max_size=40).map(str.encode),
    st.sampled_from([b"", b"\r", b"   ", b"null", b"[]", b'{"payload": []}', b'{"payload": null}', b'{"payload": {}}',
                     b'{"payload": {"x": NaN}}', b'{"payload": {"x": 1e999}}', b"\xef\xbb\xbf{}", b'{"payload": {"a": 1}}',
                     b'{"payload": {"a": ' + b"1" * 4400 + b"}}", b"[" * 3000, b'"\\ud800"', b'{"payload": {"\\u0000": 1}}']),
    st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                 lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
                 max_leaves=6).map(lambda v: json.dumps({"payload": v}).encode()),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_LINE, max_size=6), st.sampled_from([b"\n", b"\r\n"]))
def test_any_jsonl_counts_rows_or_names_the_line(tmp_path, lines, sep):
    path = _write(tmp_path, sep.join(lines))
    try:
        rows = check_dataset(path, 1)
    except DatasetError as e:
        assert str(e).startswith(path), str(e)
        return
    payloads = list(iter_payloads(path))
    assert rows == len(payloads) >= 1 and all(isinstance(p, dict) for p in payloads)
    json.dumps(payloads, allow_nan=False)  # what the agent is invoked with


def test_lines_longer_than_a_read_are_joined_and_a_line_no_payload_limit_allows_is_refused(tmp_path, monkeypatch):
    import stepwise.datasets as datasets

    monkeypatch.setattr(datasets, "READ_CHUNK", 7)  # every line spans several reads
    rows = [{"payload": {"prompt": "x" * n, "i": n}} for n in (0, 5, 30)]
    path = _write(tmp_path, b"\n".join(json.dumps(r).encode() for r in rows) + b"\n\n")
    assert list(iter_payloads(path)) == [r["payload"] for r in rows]
    monkeypatch.setattr(datasets, "MAX_LINE_BYTES", 40)
    with pytest.raises(DatasetError, match=r":3: line longer than 40 bytes"):
        check_dataset(path, 1)


@pytest.mark.parametrize("value, fragment", [
    pytest.param({"p": "a", "t": __import__("datetime").datetime(2024, 1, 1)}, "datetime", id="timestamp"),
    pytest.param({"p": b"\x00\xff"}, "bytes", id="binary"),
    pytest.param({"p": __import__("decimal").Decimal("1.5")}, "Decimal", id="decimal"),
    pytest.param({"p": float("nan")}, "NaN", id="NaN"),
])
def test_a_parquet_payload_json_cannot_carry_is_refused_by_validate_as_by_init(tmp_path, value, fragment):
    # check_dataset (validate --check-datasets) said ok and Init's snapshot raised TypeError or wrote NaN.
    import pyarrow as pa
    import pyarrow.parquet as pq

    from stepwise.datasets import shard_dataset

    path = str(tmp_path / "train.parquet")
    pq.write_table(pa.table({"payload": pa.array([{k: v for k, v in value.items()}])}), path)
    for check in (lambda: check_dataset(path, 1), lambda: shard_dataset(path, 1, lambda i, body: None)):
        with pytest.raises(DatasetError) as e:
            check()
        assert f"{path}: row 0 (0-based)" in str(e.value) and fragment in str(e.value), str(e.value)
