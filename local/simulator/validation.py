"""Request validation against botocore's service models, with the services' error codes.

``botocore.validate.ParamValidator`` checks required members, types and minimums (what the
client side checks); the service also enforces maximums, enums and patterns, which
``_constraint_errors`` adds from the same shapes.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import botocore.session
from botocore.model import ServiceModel, Shape
from botocore.validate import ParamValidator


class ApiError(Exception):
    """An error answer: botocore error ``code``, HTTP ``status``, ``message``."""

    def __init__(self, code: str, message: str, status: int = 400) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status


CONTROL = "sagemaker"
RUNTIME = "sagemakertrainingsessionruntime"

#: Error codes and HTTP statuses per service (botocore shapes: runtime ``*Exception`` with
#: ``httpStatusCode``; the JSON 1.1 ``sagemaker`` service answers 400 for client errors).
_CODES = {
    CONTROL: {
        "validation": ("ValidationException", 400),
        "not_found": ("ResourceNotFound", 400),
        "in_use": ("ResourceInUse", 400),
        "conflict": ("ConflictException", 400),
        "throttle": ("ThrottlingException", 400),
        "internal": ("InternalFailure", 500),
        "unavailable": ("ServiceUnavailable", 503),
        # IAM's refusal of a call the caller's policy does not grant (JSON 1.1: 400)
        "access_denied": ("AccessDeniedException", 400),
    },
    RUNTIME: {
        "validation": ("ValidationException", 400),
        "not_found": ("ResourceNotFoundException", 404),
        "in_use": ("ConflictException", 409),
        "conflict": ("ConflictException", 409),
        "throttle": ("ThrottlingException", 429),
        "internal": ("InternalServerException", 500),
        # Not among the runtime's modelled errors: what a warming-up or binding runtime answers is
        # undocumented; the SDK retries it as transient by its 503 (exceptions.is_retryable).
        "unavailable": ("ServiceUnavailableException", 503),
        "access_denied": ("AccessDeniedException", 403),
    },
}


def error(service: str, kind: str, message: str) -> ApiError:
    """Build the ``ApiError`` a service answers for ``kind`` (validation, not_found, ...)."""
    code, status = _CODES[service][kind]
    return ApiError(code, message, status)


@functools.lru_cache(maxsize=None)
def service_model(service: str) -> ServiceModel:
    return botocore.session.get_session().get_service_model(service)


def validate(service: str, operation: str, params: dict[str, Any]) -> None:
    """Raise the service's ``ValidationException`` if ``params`` do not fit the input shape."""
    model = service_model(service).operation_model(operation)
    shape = model.input_shape
    if shape is None:
        return
    report = ParamValidator().validate(params, shape)
    if report.has_errors():
        raise error(service, "validation", f"{operation}: {report.generate_report()}")
    problems: list[str] = []
    _constraint_errors(params, shape, "", problems)
    if problems:
        raise error(service, "validation", f"{operation}: " + "; ".join(problems[:5]))


def _constraint_errors(value: Any, shape: Shape, path: str, out: list[str]) -> None:
    name = path or "input"
    t = shape.type_name
    meta = shape.metadata
    if t == "structure":
        if getattr(shape, "is_document_type", False) or not isinstance(value, dict):
            return
        members = shape.members
        if meta.get("union") and len([k for k, v in value.items() if v is not None]) != 1:
            out.append(f"{name} must set exactly one of {', '.join(members)}")
        for key, sub in value.items():
            if key in members and sub is not None:
                _constraint_errors(sub, members[key], f"{path}.{key}" if path else key, out)
    elif t == "list" and isinstance(value, list):
        if "max" in meta and len(value) > meta["max"]:
            out.append(f"{name} has {len(value)} items; at most {meta['max']} allowed")
        for i, item in enumerate(value):
            _constraint_errors(item, shape.member, f"{name}[{i}]", out)
    elif t == "map" and isinstance(value, dict):
        for k, item in value.items():
            _constraint_errors(item, shape.value, f"{name}[{k!r}]", out)
    elif t == "string" and isinstance(value, str):
        if "max" in meta and len(value) > meta["max"]:
            out.append(f"{name} is {len(value)} characters; at most {meta['max']} allowed")
        if shape.enum and value not in shape.enum:
            out.append(f"{name}={value!r} is not one of {', '.join(shape.enum)}")
        pattern = meta.get("pattern")
        if pattern:
            try:
                ok = re.fullmatch(pattern, value) is not None
            except re.error:  # \p{L}-style classes: Python's re cannot check them
                ok = True
            if not ok:
                out.append(f"{name}={value!r} does not match pattern {pattern}")
    elif t in ("integer", "long", "double", "float") and isinstance(value, (int, float)) and not isinstance(value, bool):
        if "max" in meta and value > meta["max"]:
            out.append(f"{name}={value} is above the maximum {meta['max']}")
        if "min" in meta and value < meta["min"]:
            out.append(f"{name}={value} is below the minimum {meta['min']}")
