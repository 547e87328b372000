"""The run's tokenizer and chat-template renderer, loaded once per container.

Each run caches its tokenizer files under ``runs/{run_id}/tokenizer/`` (Init writes them).
The first turn of a run in a container downloads them to local disk and builds a toolkit
``HfTemplateRenderer``; later turns reuse it. ``transformers`` is imported only then.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import threading
from collections.abc import Callable
from typing import Any

from agentcore_rl_toolkit.rollout_gateway.render import ParsedOutput

from stepwise.records import SessionRecord

#: (record) -> tokenizer; the default downloads from S3. Tests may inject a local loader.
TokenizerLoader = Callable[[SessionRecord], Any]

#: transformers' lazy module is not safe to import from two threads at once (the server's
#: warm-up thread and a first turn's loader, or two runs' first turns): that fails with
#: "cannot import name 'AutoTokenizer'". Every import and tokenizer load holds this lock.
_IMPORT_LOCK = threading.RLock()


def auto_tokenizer_class() -> Any:
    """``transformers.AutoTokenizer``, imported under the gateway's import lock."""
    with _IMPORT_LOCK:
        from transformers import AutoTokenizer

        return AutoTokenizer


def load_tokenizer_dir(path: str) -> Any:
    """``AutoTokenizer.from_pretrained(path)`` under the import lock (loads import lazily too)."""
    with _IMPORT_LOCK:
        return auto_tokenizer_class().from_pretrained(path)


def download_prefix(s3: Any, bucket: str, prefix: str, dest: str) -> list[str]:
    """Copy every object under ``prefix`` into ``dest`` (flat); returns the file names.

    Raises FileNotFoundError naming the bucket and prefix when nothing is there.
    """
    names: list[str] = []
    paginator = s3.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            rel = obj["Key"][len(prefix) :]
            if not rel or rel.endswith("/"):
                continue
            path = os.path.join(dest, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            s3.download_file(bucket, obj["Key"], path)
            names.append(rel)
    if not names:
        raise FileNotFoundError(f"no tokenizer files under s3://{bucket}/{prefix}")
    return names


class S3TokenizerLoader:
    """Default loader: ``runs/{run_id}/tokenizer/`` -> ``/tmp`` -> ``AutoTokenizer.from_pretrained``."""

    def __init__(self, s3: Any, bucket: str, root: str | None = None) -> None:
        self.s3 = s3
        self.bucket = bucket
        self.root = root or os.path.join(tempfile.gettempdir(), "stepwise-tokenizers")

    def __call__(self, record: SessionRecord) -> Any:
        dest = tempfile.mkdtemp(prefix=f"{record.run_id}-", dir=_ensure(self.root))
        download_prefix(self.s3, self.bucket, record.resolved_tokenizer_prefix(), dest)
        return load_tokenizer_dir(dest)


def _ensure(path: str) -> str:
    os.makedirs(path, exist_ok=True)
    return path


class RunRenderers:
    """One ``HfTemplateRenderer`` per (run, chat_template_kwargs), built on first use.

    Concurrent first turns of a run wait on one load.
    """

    def __init__(self, loader: TokenizerLoader) -> None:
        self._loader = loader
        self._renderers: dict[tuple[str, str], Any] = {}
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self.loads = 0

    @staticmethod
    def key(record: SessionRecord) -> tuple[str, str]:
        return (record.run_id, json.dumps(record.chat_template_kwargs, sort_keys=True))

    async def get(self, record: SessionRecord) -> Any:
        key = self.key(record)
        renderer = self._renderers.get(key)
        if renderer is not None:
            return renderer
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            renderer = self._renderers.get(key)
            if renderer is None:
                renderer = await asyncio.to_thread(self._build, record)
                self._renderers[key] = renderer
                self.loads += 1
        return renderer

    def _build(self, record: SessionRecord) -> Any:
        from agentcore_rl_toolkit.rollout_gateway import HfTemplateRenderer

        tokenizer = self._loader(record)
        return HfTemplateRenderer(tokenizer, chat_template_kwargs=record.chat_template_kwargs or None)


class RoutingRenderer:
    """The ``Renderer`` injected into the adapters: delegates to the current request's
    run renderer (a container may serve sessions of several runs)."""

    def __init__(self, current_renderer: Callable[[], Any]) -> None:
        self._current = current_renderer

    def _renderer(self) -> Any:
        renderer = self._current()
        if renderer is None:
            raise RuntimeError("no renderer in scope: the gateway middleware resolves it per request")
        return renderer

    async def render(self, messages: list[dict], *, tools: list[dict] | None = None,
                     add_generation_prompt: bool = True) -> list[int]:
        return await self._renderer().render(messages, tools=tools, add_generation_prompt=add_generation_prompt)

    def get_stop_sequences(self) -> list:
        return self._renderer().get_stop_sequences()

    def parse(self, output_ids: list[int], *, tools_schema: list[dict] | None = None) -> ParsedOutput:
        return self._renderer().parse(output_ids, tools_schema=tools_schema)
