"""prepare_gsm8k: GSM8K JSONL -> payload rows, read back with the datasets loader."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from prepare_datasets.prepare_gsm8k import PrepareError, extract_final_answer, gsm8k_rows, main, source_file
from stepwise.datasets import load_payloads

REPO = Path(__file__).resolve().parents[2]


def _gsm8k_dir() -> Path | None:
    try:
        return source_file("test").parent
    except FileNotFoundError:
        return None


DATA = _gsm8k_dir() or Path("missing")
needs_data = pytest.mark.skipif(_gsm8k_dir() is None, reason="GSM8K's files not found (set STEPWISE_GSM8K_DIR)")


@needs_data
@pytest.mark.parametrize(("split", "rows"), [("test", 1319), ("train", 7473)])
def test_gsm8k_split_to_parquet_row_counts_and_answers(tmp_path, split, rows):
    out = tmp_path / f"{split}.parquet"
    assert main(["--input", str(DATA / f"{split}.jsonl"), "--output", str(out)]) == 0
    payloads = load_payloads(str(out))
    assert len(payloads) == rows
    assert all(set(p) == {"prompt", "answer"} for p in payloads)
    assert all(p["answer"].lstrip("-").replace(".", "", 1).isdigit() for p in payloads)
    if split == "test":
        assert payloads[0]["answer"] == "18"
        assert payloads[0]["prompt"].startswith("Janet\u2019s ducks lay 16 eggs")


@needs_data
def test_module_entry_point_writes_jsonl(tmp_path):
    out = tmp_path / "test.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "prepare_datasets.prepare_gsm8k", "--input", str(DATA / "test.jsonl"), "--output", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "1319 rows" in proc.stdout
    first = json.loads(out.read_text().splitlines()[0])
    assert first["payload"]["answer"] == "18"
    assert len(load_payloads(str(out))) == 1319


@pytest.mark.parametrize(
    ("text", "answer"),
    [("so 3+4=7\n#### 7", "7"), ("#### 1,234,567", "1234567"), ("x\n####   -5  ", "-5"), ("#### 2.5", "2.5")],
)
def test_extract_final_answer(text, answer):
    assert extract_final_answer(text) == answer


@pytest.mark.parametrize(
    ("bad_line", "fragment"),
    [
        ("{not json", "Expecting property name"),
        ('{"question": "q", "answer": "no marker"}', "no '#### <answer>' marker"),
        ('{"question": "q"}', "needs string fields"),
        ("[1]", "not a JSON object"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path, capsys, bad_line, fragment):
    src = tmp_path / "in.jsonl"
    src.write_text('{"question": "q1", "answer": "#### 1"}\n\n' + bad_line + "\n")
    with pytest.raises(PrepareError) as exc:
        gsm8k_rows(src)
    assert str(exc.value).startswith(f"{src}:3: ") and fragment in str(exc.value)
    assert main(["--input", str(src), "--output", str(tmp_path / "o.parquet")]) == 2
    assert f"{src}:3:" in capsys.readouterr().err
    assert not (tmp_path / "o.parquet").exists()
