"""Evaluate the toolkit's legacy ``response_schema`` dicts (the ``x-regex`` format).

agentcore-rl-toolkit 0.2.0 vendors one such schema per model family
(``rollout_gateway/response_schemas.py``: qwen3, qwen3_5, glm4moe, gptoss) and hands it to
``tokenizer.parse_response(text, schema=...)``. transformers >= 5.13 dropped that format
for region-based ``response_template``s, so the gateway evaluates the toolkit's schemas
itself (``_toolkit.adapt_tokenizer`` routes the call here). The format is a JSON Schema
annotated with extraction directives:

- ``x-regex-substitutions``: ``[[pattern, replacement], ...]`` applied to the text first;
- ``x-regex``: named groups become the object's fields, or the single group becomes the text;
- ``x-regex-iterator``: an array's items are the matches (group 1, else the whole match);
- ``x-regex-key-value``: an object's ``key``/``value`` group pairs;
- ``x-parser: json`` (``allow_non_json`` keeps unparsable text, ``transform`` is a JMESPath
  expression applied to the result);
- ``const`` fields are always set; ``default`` fills an absent field;
  ``additionalProperties`` (a schema) parses the values of fields not listed in ``properties``.

An object whose text was not split into fields hands the same text to each property (the
qwen3_5 items, whose name and arguments are both read from one ``<tool_call>`` block).
All regexes run with ``re.DOTALL``. Returns None when the top-level regex does not match.
"""

from __future__ import annotations

import json
import re
from typing import Any

_MISSING = object()


def parse_with_schema(text: str, schema: dict) -> Any:
    """Parse model output ``text`` with a legacy response schema; None if it does not match."""
    value = _parse(text, schema)
    return None if value is _MISSING else value


def _parse(content: Any, schema: dict) -> Any:
    if "const" in schema:
        return schema["const"]
    if content is None:
        return _MISSING
    if isinstance(content, str):
        for pattern, replacement in schema.get("x-regex-substitutions", ()):
            content = re.sub(pattern, replacement, content, flags=re.DOTALL)
        if "x-regex" in schema:
            m = re.search(schema["x-regex"], content, flags=re.DOTALL)
            if m is None:
                return _MISSING
            named = m.groupdict()
            if named:
                content = {k: v for k, v in named.items() if v is not None}
            elif m.groups():
                content = m.group(1)
            else:
                content = m.group(0)
    if isinstance(content, str) and "x-regex-iterator" in schema:
        content = [m.group(1) if m.groups() else m.group(0)
                   for m in re.finditer(schema["x-regex-iterator"], content, flags=re.DOTALL)]
    if isinstance(content, str) and "x-regex-key-value" in schema:
        content = {m.group("key").strip(): m.group("value")
                   for m in re.finditer(schema["x-regex-key-value"], content, flags=re.DOTALL)}
        if not content and "default" in schema:
            return dict(schema["default"])
    if isinstance(content, str) and schema.get("x-parser") == "json":
        content = _json(content, schema.get("x-parser-args") or {})
    return _shape(content, schema)


def _json(text: str, args: dict) -> Any:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        if args.get("allow_non_json"):
            return text
        raise ValueError(f"response schema expected JSON, got {text[:80]!r}") from None
    if "transform" in args:
        import jmespath

        value = jmespath.search(args["transform"], value)
    return value


def _shape(content: Any, schema: dict) -> Any:
    kind = schema.get("type")
    if kind == "array" and isinstance(content, list):
        items = schema.get("items") or {}
        return [v for v in (_parse(item, items) for item in content) if v is not _MISSING]
    if kind == "object" and "properties" in schema:
        out: dict[str, Any] = {}
        props: dict = schema["properties"]
        for key, sub in props.items():
            if "const" in sub:
                out[key] = sub["const"]
                continue
            if isinstance(content, dict):
                raw = content.get(key)
            else:  # unsplit text: each property reads the same text
                raw = content
            value = _parse(raw, sub) if raw is not None else _MISSING
            if value is _MISSING and "default" in sub:
                value = sub["default"]
            if value is not _MISSING:
                out[key] = value
        extra = schema.get("additionalProperties")
        if isinstance(content, dict) and isinstance(extra, dict):
            for key, raw in content.items():
                if key not in props:
                    value = _parse(raw, extra) if extra else raw
                    out[key] = raw if value is _MISSING else value
        return out
    if kind == "object" and isinstance(content, dict):
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict) and extra:
            return {k: (v2 if (v2 := _parse(v, extra)) is not _MISSING else v) for k, v in content.items()}
        return content
    return content
