"""The SageMaker Public Hub: which base models training sessions offer in a region, and what the hub says of
one (its versioned ARN, published model id, whether it is gated).

Everything goes through the SDK's own hub functions (``sagemaker.train.training_session._utils``:
``list_base_models_in_region`` is ``ServiceClient.list_base_models``, ``resolve_base_model`` is what
``create_lora_training_client`` resolves ``base_model`` with) on a plain boto3 ``sagemaker`` client, so a
model listed here is one the SDK, and so Init, accepts. The hub's ``DescribeHubContent`` (botocore's
``sagemaker`` model) returns ``HubContentDocument``, a JSON string: its ``HuggingfaceId`` is the tokenizer's
id and its ``GatedBucket`` marks a model whose license must be accepted, the flag the SDK's own trainers read
(``sagemaker.train.common_utils.finetune_utils``: ``is_gated_model = document.get("GatedBucket", False)``).
boto3 honours ``AWS_ENDPOINT_URL_SAGEMAKER`` (the local simulator's hub).

The tokenizer (`tokenizer_source`): the SDK's ``load_tokenizer`` looks the model's ``HuggingfaceId`` up on the hub
and calls ``AutoTokenizer.from_pretrained`` on it, which downloads from the Hugging Face Hub and reads its token
from ``HF_TOKEN``. A gated repository needs a token whose account accepted the model's license: tried in order,
``HF_TOKEN`` in the environment, then the Secrets Manager secret the stack names (`token_sources`). Its access is
checked with the Hugging Face client's own ``auth_check`` (``GET /api/models/{id}/auth-check``; ``HF_ENDPOINT``
redirects it, as it does the download) before any training session exists.
"""

from __future__ import annotations

import json
from typing import Any

from stepwise.core.preflight import HubModel, TokenizerSource

#: The environment variable the Hugging Face client reads its token from (and `token_sources` tries first).
HF_TOKEN = "HF_TOKEN"

PUBLIC_HUB = "SageMakerPublicHub"


def hub_client(region: str) -> Any:
    """A boto3 ``sagemaker`` client in ``region`` (the hub is published per region)."""
    import boto3

    return boto3.client("sagemaker", region_name=region)


def _name_of(base_model: str) -> str:
    """The hub content name of a hub-content ARN (``.../hub-content/HUB/Model/NAME[/VERSION]``), else itself."""
    parts = base_model.split("/")
    return parts[3] if base_model.startswith("arn:") and len(parts) >= 4 else base_model


def describe(client: Any, hub_content_name: str, model_id: str = "") -> HubModel:
    """DescribeHubContent of one model, as a `HubModel` (raises botocore's ClientError)."""
    from sagemaker.train.training_session._utils import _describe_hub_content

    resp = _describe_hub_content(hub_content_name, client)
    try:
        document = json.loads(resp.get("HubContentDocument") or "{}")
    except (TypeError, ValueError):
        document = {}
    document = document if isinstance(document, dict) else {}
    return HubModel(
        name=hub_content_name, arn=str(resp.get("HubContentArn", "")),
        model_id=model_id or str(document.get("HuggingfaceId") or hub_content_name),
        version=str(resp.get("HubContentVersion", "")), display_name=str(resp.get("HubContentDisplayName", "")),
        gated=bool(document.get("GatedBucket", False)), hf_model_id=str(document.get("HuggingfaceId") or ""))


def base_models(region: str, client: Any = None) -> list[HubModel]:
    """Every base model training sessions offer in ``region`` (``ServiceClient.list_base_models``), described,
    sorted as the SDK sorts them (by id, case-insensitively)."""
    from sagemaker.train.training_session._utils import _hub_model_index, list_base_models_in_region

    client = client or hub_client(region)
    ids = list_base_models_in_region(client)
    index = _hub_model_index(client)  # the scan list_base_models_in_region just made: {id: hub content name}
    return [describe(client, index[model_id], model_id) for model_id in ids]


def lookup(region: str, base_model: str, client: Any = None) -> HubModel:
    """What the hub says of a config's ``base_model_arn`` (a hub-content ARN, hub content name or model id),
    resolved as Init's CreateTrainingSession resolves it.

    Raises:
        ValueError: the hub offers no such model in ``region`` (the SDK's message lists those it offers).
        botocore's ClientError / BotoCoreError: the hub cannot be asked.
    """
    from sagemaker.train.training_session._utils import resolve_base_model

    client = client or hub_client(region)
    arn, hf_id = resolve_base_model(base_model, client)
    model = describe(client, _name_of(arn))
    return model if base_model.startswith("arn:") else HubModel(**{**model.__dict__, "arn": arn,
                                                                    "hf_model_id": hf_id or model.hf_model_id})


def base_model_problem(region: str, base_model: str) -> HubModel | str:
    """`lookup`, or what is wrong in words: the model is not offered, or the hub cannot be asked (the
    refusals before billing, `stepwise.core.preflight.Probes.base_model`)."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return lookup(region, base_model)
    except ValueError as e:
        return f"the SageMaker Public Hub in {region} offers no such base model: {' '.join(str(e).split())}"
    except ClientError as e:
        err = e.response.get("Error", {})
        return f"the base model cannot be looked up (DescribeHubContent: {err.get('Code', '')}: {err.get('Message', '')})"
    except BotoCoreError as e:
        return f"the base model cannot be looked up ({e})"


def token_sources(env: dict[str, str] | None = None, *, secret_reader: Any = None) -> list[tuple[str, Any]]:
    """The Hugging Face tokens to try, in order: ``(where, token or a callable giving it)``: ``HF_TOKEN`` in ``env``
    (default this process's), then the secret ``STEPWISE_HF_TOKEN_SECRET_ARN`` names (read lazily with
    ``secret_reader(arn)``, default `stepwise.aws.secrets.secret_string`)."""
    import os

    from stepwise.settings import ENV_HF_TOKEN_SECRET

    env = os.environ if env is None else env
    out: list[tuple[str, Any]] = []
    if env.get(HF_TOKEN):
        out.append((HF_TOKEN, env[HF_TOKEN]))
    arn = env.get(ENV_HF_TOKEN_SECRET, "")
    if arn:
        if secret_reader is None:
            from stepwise.aws.secrets import secret_string as secret_reader
        out.append((f"the secret {arn}", lambda: secret_reader(arn)))
    return out


def _repo(hf_id: str) -> bool:
    """Whether ``hf_id`` names a Hugging Face repository (``org/name``), not a folder on this machine."""
    import os

    return not os.path.isdir(hf_id) and hf_id.count("/") == 1 and not hf_id.startswith((".", "/", "~"))


def tokenizer_source(tokenizer_path: str, model: HubModel | None, tokens: list[tuple[str, Any]], *,
                     endpoint: str | None = None) -> TokenizerSource:
    """Where the run's tokenizer comes from and whether it can be loaded (`TokenizerSource`; the module doc).

    ``tokens``: `token_sources`' list. ``endpoint``: the Hugging Face Hub (default ``HF_ENDPOINT``, else the
    client's own). A hub that cannot be reached is a note ("not checked"), never a refusal."""
    import os

    if tokenizer_path.startswith("s3://"):
        return TokenizerSource("tokenizer_path (s3)", tokenizer_path)
    hf_id = tokenizer_path or (model.hf_model_id if model else "") or (model.model_id if model else "")
    kind = "tokenizer_path" if tokenizer_path else "Hugging Face"
    if not hf_id or not _repo(hf_id):
        return TokenizerSource("local directory" if hf_id and os.path.isdir(hf_id) else kind, hf_id)
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    api = HfApi(endpoint=endpoint or os.environ.get("HF_ENDPOINT") or None)
    try:
        api.auth_check(hf_id, token=False)
        return TokenizerSource(kind, hf_id, note="public: no token needed")
    except GatedRepoError:
        pass
    except RepositoryNotFoundError:
        return TokenizerSource(kind, hf_id, problem=f"the Hugging Face repository {hf_id!r} of the tokenizer does not "
                                                    f"exist or is private; set tokenizer_path to an s3:// copy")
    except Exception as e:  # noqa: BLE001 - the hub unreachable: Init's download would say more
        return TokenizerSource(kind, hf_id, note=f"not checked: the Hugging Face Hub did not answer ({type(e).__name__})")
    tried = []
    for where, token in tokens:
        try:
            value = token() if callable(token) else token
        except Exception as e:  # noqa: BLE001 - a secret we may not read: say so, try the next
            tried.append(f"{where} (not readable: {type(e).__name__})")
            continue
        try:
            api.auth_check(hf_id, token=value)
            return TokenizerSource(kind, hf_id, gated=True, token_from=where, note="the token has access")
        except GatedRepoError:
            tried.append(f"{where} (no access: accept the model's license on its Hugging Face page with that account)")
        except Exception as e:  # noqa: BLE001
            return TokenizerSource(kind, hf_id, gated=True, token_from=where,
                                   note=f"not checked: the Hugging Face Hub did not answer ({type(e).__name__})")
    why = "; tried " + ", ".join(tried) if tried else ""
    return TokenizerSource(kind, hf_id, gated=True, problem=(
        f"the tokenizer's Hugging Face repository {hf_id!r} is gated and no token with access was found{why}: set "
        f"{HF_TOKEN}, or deploy the stack with -c huggingFaceTokenSecretArn=ARN (a secret holding a token whose "
        f"account accepted the license), or set tokenizer_path to an s3:// copy of the tokenizer files"))


def tokenizer_probe(tokens: list[tuple[str, Any]] | None = None) -> Any:
    """`stepwise.core.preflight.Probes.tokenizer`: `tokenizer_source` with ``tokens`` (default `token_sources`)."""
    def probe(cfg: Any, model: HubModel) -> TokenizerSource:
        return tokenizer_source(cfg.tokenizer_path, model, token_sources() if tokens is None else tokens)

    return probe


class hf_token_environment:  # noqa: N801 - a context manager, used like a function
    """``HF_TOKEN`` set, while it is active, to the first of `token_sources` (the secret's value when the
    environment has none), for ``AutoTokenizer.from_pretrained`` (Init's tokenizer download); restored after."""

    def __enter__(self) -> None:
        import os

        self.saved = os.environ.get(HF_TOKEN)
        if not self.saved:
            for _, token in token_sources():
                try:
                    os.environ[HF_TOKEN] = token() if callable(token) else token
                    break
                except Exception:  # noqa: BLE001 - the preflight already said which source works
                    continue

    def __exit__(self, *exc: Any) -> None:
        import os

        if self.saved is None:
            os.environ.pop(HF_TOKEN, None)
        else:
            os.environ[HF_TOKEN] = self.saved
