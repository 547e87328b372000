"""The training loop's ASL: one file, loaded by the CDK stack and by the local stack alike.

``training_loop.asl.json`` is JSONPath ASL (moto's engine has no JSONata) with ``${Name}``
placeholders for deployed resources: ``${<Name>FunctionArn}`` for every entry of
``stepwise.functions.FUNCTIONS`` the ASL uses, ``${BucketName}``, and ``${Partition}`` in service
integration ARNs (``arn:${Partition}:states:::lambda:invoke``). The stack passes the
file text to ``DefinitionBody.from_string`` with ``definition_substitutions``; the local stack
calls :func:`render_definition` with literal values. Both substitute the same placeholders in
the same text, so the deployed and the local definitions are the same document.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ASL_PATH = Path(__file__).with_name("training_loop.asl.json")

#: ``${Name}`` as Step Functions' DefinitionSubstitutions spells a placeholder.
PLACEHOLDER_RE = re.compile(r"\$\{([A-Za-z0-9_]+)\}")


def load_definition() -> str:
    """The ASL text with its ``${...}`` placeholders (what the stack hands to Step Functions)."""
    return ASL_PATH.read_text()


def placeholders(text: str | None = None) -> set[str]:
    """The placeholder names the ASL uses (``{"InitFunctionArn", ..., "BucketName", "Partition"}``)."""
    return set(PLACEHOLDER_RE.findall(load_definition() if text is None else text))


def render_definition(substitutions: Mapping[str, str], text: str | None = None) -> str:
    """Substitute every ``${Name}`` with ``substitutions[Name]`` and return valid ASL JSON text.

    Values are inserted verbatim (they sit inside JSON strings: ARNs and the bucket name), as
    Step Functions' DefinitionSubstitutions does.

    Raises:
        KeyError: a placeholder has no value (names every missing one).
        ValueError: a value would break the JSON string it is inserted into.
    """
    text = load_definition() if text is None else text
    missing = sorted(placeholders(text) - set(substitutions))
    if missing:
        raise KeyError(f"no value for ASL placeholder(s) {missing}; given {sorted(substitutions)}")
    bad = [k for k, v in substitutions.items() if not isinstance(v, str) or '"' in v or "\\" in v]
    if bad:
        raise ValueError(f"substitution values must be plain strings without quotes or backslashes: {bad}")
    rendered = PLACEHOLDER_RE.sub(lambda m: substitutions[m.group(1)], text)
    json.loads(rendered)  # still valid JSON
    return rendered


def load_asl() -> dict[str, Any]:
    """The ASL as a dict (placeholders left in place)."""
    return json.loads(load_definition())
