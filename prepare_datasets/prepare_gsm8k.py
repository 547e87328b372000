"""GSM8K JSONL -> payload rows for the math agent.

    python prepare_datasets/prepare_gsm8k.py --input test.jsonl --output gsm8k_test.parquet
    python -m prepare_datasets.prepare_gsm8k --input train.jsonl --output gsm8k_train.jsonl
    python -m prepare_datasets.prepare_gsm8k --split train --output gsm8k_train.jsonl   # from STEPWISE_GSM8K_DIR

Each input line is a GSM8K record ``{"question": ..., "answer": "...#### 18"}``; each output row is
``{"payload": {"prompt": question, "answer": "18"}}``: the text after ``####`` with thousands
separators removed, as the reference's
`agentcore_rl_toolkit/backends/experimental/sagemaker/prepare_datasets/prepare_gsm8k.py`
(which reads the Hub dataset; this reads local JSONL, so nothing is downloaded).
Output is Parquet (one struct ``payload`` column) when the name ends in ``.parquet``, JSONL otherwise.

The GSM8K files themselves are not in this repository: ``train.jsonl`` (7,473 rows) and ``test.jsonl``
(1,319 rows) of GSM8K (MIT licence; ``grade_school_math/data/`` of the openai/grade-school-math
repository, the same rows as the Hugging Face dataset ``openai/gsm8k``, config ``main``). `source_file`
finds them in ``STEPWISE_GSM8K_DIR``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

ANSWER_RE = re.compile(r"####\s*(.+?)\s*$")

#: Environment variable: the folder holding GSM8K's ``train.jsonl`` and ``test.jsonl``.
ENV_GSM8K_DIR = "STEPWISE_GSM8K_DIR"
SPLITS = ("train", "test")


def source_file(split: str) -> Path:
    """GSM8K's ``{split}.jsonl`` (``split``: train | test): in ``STEPWISE_GSM8K_DIR`` when it is set, else in
    the copy this project's machines keep beside the clone.

    Raises:
        FileNotFoundError: naming the variable to set and where the files come from.
    """
    import os

    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    root = Path(__file__).resolve().parents[1]
    configured = os.environ.get(ENV_GSM8K_DIR)
    candidates = [Path(configured)] if configured else [root.parent / "shared" / "data" / "gsm8k",
                                                        Path("/work") / "shared" / "data" / "gsm8k"]
    for folder in candidates:
        if (folder / f"{split}.jsonl").is_file():
            return folder / f"{split}.jsonl"
    raise FileNotFoundError(
        f"GSM8K's {split}.jsonl not found (looked in {', '.join(str(c) for c in candidates)}): set {ENV_GSM8K_DIR} "
        "to a folder holding GSM8K's train.jsonl and test.jsonl (MIT licence; grade_school_math/data/ of the "
        "openai/grade-school-math repository)")


class PrepareError(ValueError):
    """A malformed input line; the message names the file and the 1-based line."""


def extract_final_answer(answer_field: str) -> str:
    """The final answer after ``####``, thousands separators removed (reference ``extract_final_answer``).

    Raises:
        ValueError: no ``#### <answer>`` marker.
    """
    match = ANSWER_RE.search(answer_field)
    if match is None:
        raise ValueError(f"no '#### <answer>' marker in answer {answer_field[-80:]!r}")
    return match.group(1).replace(",", "").strip()


def gsm8k_rows(path: Path) -> list[dict[str, Any]]:
    """Read a GSM8K JSONL file into ``[{"payload": {"prompt", "answer"}}]``, in file order.

    Raises:
        PrepareError: a line that is not JSON, lacks a string ``question``/``answer``, or has no answer marker.
    """
    rows: list[dict[str, Any]] = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                if not isinstance(rec, dict):
                    raise ValueError("line is not a JSON object")
                question, answer = rec.get("question"), rec.get("answer")
                if not isinstance(question, str) or not isinstance(answer, str):
                    raise ValueError("needs string fields 'question' and 'answer'")
                rows.append({"payload": {"prompt": question, "answer": extract_final_answer(answer)}})
            except ValueError as e:  # json.JSONDecodeError is a ValueError
                raise PrepareError(f"{path}:{lineno}: {e}") from e
    return rows


def write_rows(rows: list[dict[str, Any]], output: Path) -> None:
    """Write rows as Parquet (``.parquet``: one struct ``payload`` column) or JSONL (any other name)."""
    output.parent.mkdir(parents=True, exist_ok=True)
    if output.suffix == ".parquet":
        pq.write_table(pa.table({"payload": pa.array([r["payload"] for r in rows])}), output)
    else:
        with output.open("w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--input", type=Path, help="GSM8K JSONL (question, answer)")
    source.add_argument("--split", choices=SPLITS, help=f"GSM8K's train or test split, from {ENV_GSM8K_DIR}")
    parser.add_argument("--output", required=True, type=Path, help="Y.parquet or Y.jsonl")
    args = parser.parse_args(argv)
    try:
        rows = gsm8k_rows(args.input or source_file(args.split))
    except (PrepareError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    write_rows(rows, args.output)
    print(f"wrote {args.output}: {len(rows)} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
