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
"""

from __future__ import annotations

import json
from typing import Any

from stepwise.core.preflight import HubModel

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
