"""The sampling seam: each session samples from the sampler its record names.

The adapters call ``backend.generate(prompt_ids=, sampling_params=, session_id=)``. We
resolve the request's session record (training session name + sampler model package ARN)
to a toolkit ``SageMakerSdkBackend`` over a ``SamplingClient`` constructed directly with
no ``ServiceClient`` (such a client has no finalizer that stops the session when it is
garbage-collected: the SDK's ``_session_handle``), cached per (region, session, ARN).

Seeds: the gateway computes each turn's seed (`stepwise.core.seeding.turn_seed`) and
`SessionSamplerBackend` hands it to the backend as ``sampling_params["seed"]``. The toolkit's
``SageMakerSdkBackend`` builds the SDK ``SamplingParams`` without a seed, so the default factory
gives it a `SeedingSamplingClient`, which sets ``SamplingParams.seed`` (the runtime's
``SamplingParams.seed``) from the turn being served.
"""

from __future__ import annotations

import contextvars
import os
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from agentcore_rl_toolkit.rollout_gateway.trajectory import TurnRecord

from stepwise.records import SessionRecord

from . import _toolkit

#: Builds the token-in/token-out backend for one session record.
SamplerFactory = Callable[[SessionRecord], Any]

#: The seed of the sample being drawn on this task (set by `SessionSamplerBackend.generate`).
_TURN_SEED: contextvars.ContextVar[int | None] = contextvars.ContextVar("stepwise_turn_seed", default=None)


class SeedingSamplingClient:
    """A ``SamplingClient`` whose ``sample()`` carries the current turn's seed.

    The toolkit backend calls ``sample(prompt=, num_samples=, sampling_params=)`` synchronously
    inside its ``generate``, on the task that `SessionSamplerBackend.generate` set the seed on.
    Every other attribute is the wrapped client's.
    """

    def __init__(self, client: Any) -> None:
        self._client = client

    def sample(self, *args: Any, sampling_params: Any = None, **kwargs: Any) -> Any:
        seed = _TURN_SEED.get()
        if seed is not None and sampling_params is not None and getattr(sampling_params, "seed", None) is None:
            sampling_params = sampling_params.model_copy(update={"seed": seed})
        return self._client.sample(*args, sampling_params=sampling_params, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

_RUNTIME_SERVICE = "sagemakertrainingsessionruntime"
_RUNTIME_ENDPOINT_ENV = "SAGEMAKER_TRAINING_SESSION_RUNTIME_ENDPOINT"


class SdkSamplerFactory:
    """Default factory: ``SageMakerSdkBackend(SamplingClient(name, runtime, model_package_arn=arn))``.

    One runtime client per region (its endpoint honours
    ``SAGEMAKER_TRAINING_SESSION_RUNTIME_ENDPOINT``, as the SDK's own clients do).
    """

    def __init__(self, poll_threads: int | None = 64) -> None:
        self._runtimes: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._poll_threads = poll_threads

    def runtime(self, region: str | None) -> Any:
        import boto3
        from botocore.config import Config

        region = region or os.environ.get("AWS_REGION") or boto3.session.Session().region_name
        if not region:
            raise ValueError("no region for the sampler: set the session record's 'region' or AWS_REGION")
        with self._lock:
            client = self._runtimes.get(region)
            if client is None:
                client = boto3.client(
                    _RUNTIME_SERVICE,
                    region_name=region,
                    endpoint_url=os.environ.get(_RUNTIME_ENDPOINT_ENV) or None,
                    # Submits and polls are retried by the SDK's own loops; the pool is
                    # sized for many sessions polling at once.
                    config=Config(retries={"mode": "standard", "max_attempts": 1}, max_pool_connections=256,
                                  connect_timeout=10, read_timeout=60),
                )
                self._runtimes[region] = client
            return client

    def __call__(self, record: SessionRecord) -> Any:
        from agentcore_rl_toolkit.rollout_gateway.sampling_backends.sagemaker_sdk import SageMakerSdkBackend
        from sagemaker.train.training_session import SamplingClient

        client = SamplingClient(
            record.training_session_name,
            self.runtime(record.region),
            model_package_arn=record.sampler_model_package_arn,
            service_client=None,  # never stop the session from a gateway container
        )
        return SageMakerSdkBackend(SeedingSamplingClient(client), poll_threads=self._poll_threads)


def _client_of(backend: Any) -> Any:
    client = getattr(backend, "_sampling_client", None)
    return client._client if isinstance(client, SeedingSamplingClient) else client


class SessionSamplerBackend:
    """``SamplingBackend`` that routes each turn to its session's sampler.

    Args:
        current_record: returns the session record of the request being served.
        factory: builds a backend for a record (default :class:`SdkSamplerFactory`); tests
            inject scripted samplers here.
        cache_size: samplers kept (LRU); evicted SDK clients are retired.
        current_seed: returns the sampler seed of the turn being served, or None (unseeded).
        retry: ``(record, error) -> record or None``: after the sampler failed a turn, the record to retry
            it with once (``next_turn``: a newer sampler, `stepwise.gateway.binding`), or None to fail it.
    """

    def __init__(self, current_record: Callable[[], SessionRecord | None], factory: SamplerFactory | None = None,
                 cache_size: int = 8, current_seed: Callable[[], int | None] | None = None,
                 retry: Callable[[SessionRecord, Exception], Awaitable[SessionRecord | None]] | None = None) -> None:
        self._current_record = current_record
        self._retry = retry
        self._current_seed = current_seed or (lambda: None)
        self._factory = factory or SdkSamplerFactory()
        self._cache: OrderedDict[tuple, Any] = OrderedDict()
        self._lock = threading.Lock()
        self._cache_size = cache_size

    @staticmethod
    def cache_key(record: SessionRecord) -> tuple[str | None, str, str]:
        """Samplers are shared by every session bound to the same model package."""
        return (record.region, record.training_session_name, record.sampler_model_package_arn)

    def backend_for(self, record: SessionRecord) -> Any:
        key = self.cache_key(record)
        with self._lock:
            backend = self._cache.get(key)
            if backend is not None:
                self._cache.move_to_end(key)
                return backend
            backend = self._factory(record)
            self._cache[key] = backend
            while len(self._cache) > self._cache_size:
                _, old = self._cache.popitem(last=False)
                _toolkit.retire_sampling_client(_client_of(old))
            return backend

    def _record(self, session_id: str | None) -> SessionRecord:
        record = self._current_record()
        if record is None or record.sid != session_id:
            raise RuntimeError("generate() called outside the gateway's request scope: no session record to sample for")
        return record

    @property
    def min_new_tokens(self) -> int:
        """The floor of the current session's sampler (512 for SageMaker), read by the
        adapters' context-budget clamp; 1 outside a request."""
        record = self._current_record()
        if record is None:
            return 1
        return int(getattr(self.backend_for(record), "min_new_tokens", 1))

    async def generate(self, *, prompt_ids: list[int], sampling_params: dict, session_id: str | None = None,
                       image_data: Any = None, video_data: Any = None) -> TurnRecord:
        record = self._record(session_id)
        backend = self.backend_for(record)
        seed = self._current_seed()
        if seed is not None:
            sampling_params = {**sampling_params, "seed": seed}
        token = _TURN_SEED.set(seed)
        try:
            try:
                return await backend.generate(prompt_ids=prompt_ids, sampling_params=sampling_params, session_id=session_id)
            except Exception as error:
                retried = await self._retry(record, error) if self._retry is not None else None
                if retried is None:
                    raise
                return await self.backend_for(retried).generate(prompt_ids=prompt_ids, sampling_params=sampling_params,
                                                                session_id=session_id)
        finally:
            _TURN_SEED.reset(token)
