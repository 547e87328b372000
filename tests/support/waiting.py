"""Polling for a condition another thread or process brings about."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(pred: Callable[[], T], timeout: float = 20.0, step: float = 0.1) -> T:
    """``pred()``'s first truthy value, polled every ``step`` s for up to ``timeout`` s.

    Raises:
        AssertionError: no truthy value within ``timeout`` s.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"not within {timeout} s")
