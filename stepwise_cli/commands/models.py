"""`stepwise models [--region R] [--no-templates] [--json]`: the base models training sessions offer in a
region, whether each is gated, and whether the gateway parses its tool calls.

The list is the SDK's own (``ServiceClient.list_base_models``: the SageMaker Public Hub's models with the
training-session capability in that region), each described by the hub's ``DescribeHubContent``
(`stepwise.aws.hub`): its hub content name and version (what ``base_model_arn`` may name), and ``GatedBucket``
(a gated model needs ``accept_eula: true``), and what a training session of it costs per hour
(`stepwise.core.prices.session_price`: the dated table; where AWS publishes no figure, its high default, marked
unconfirmed, with how to read the real one from the bill). Unless ``--no-templates``, each model's tokenizer is loaded the
way Init loads it (the SDK's ``load_tokenizer``: its published id, then ``AutoTokenizer.from_pretrained``,
which downloads the tokenizer files, not the weights) and its chat template is looked up in the toolkit's
registry (``agentcore_rl_toolkit.rollout_gateway.response_schemas.resolve_schema_name``, the hashes of TRL's
templates), as the gateway does: a recognised template gets tool calls parsed; with any other, an agent
that sends ``tools`` gets an error from the gateway.

Needs ``sagemaker:ListHubContents`` and ``sagemaker:DescribeHubContent`` on the region's
``SageMakerPublicHub`` (read-only, free), and internet access to the model hub for the templates.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--region", help="AWS region whose hub to list (default: AWS_REGION, or your AWS configuration)")
    parser.add_argument("--no-templates", action="store_true",
                        help="do not load each model's tokenizer to check its chat template (no download)")
    parser.add_argument("--json", action="store_true", help="print the models as JSON")


def chat_template(model: Any, client: Any) -> dict[str, Any]:
    """``{"chat_template": schema name or None, "tool_calls": bool, "template_problem": str}`` of a `HubModel`:
    its tokenizer loaded as Init loads it, its template matched against the toolkit's registry."""
    from agentcore_rl_toolkit.rollout_gateway.response_schemas import resolve_schema_name
    from sagemaker.train.training_session._utils import load_tokenizer

    try:
        tokenizer = load_tokenizer(model.name, client, model.hf_model_id or None)
    except Exception as e:  # noqa: BLE001 - any failure to load is reported, the listing goes on
        why = " ".join(str(e).split())[:300] or type(e).__name__
        hint = ("; a gated Hugging Face repository needs HF_TOKEN here, and Init needs tokenizer_path (an s3:// "
                "copy of the tokenizer files)") if "gated" in why.lower() or "401" in why or "403" in why else ""
        return {"chat_template": None, "tool_calls": False, "template_problem": f"tokenizer not loaded: {why}{hint}"}
    schema = resolve_schema_name(tokenizer)
    if schema is None:
        return {"chat_template": None, "tool_calls": False,
                "template_problem": "chat template not in the toolkit's registry: requests with tools are refused"}
    return {"chat_template": schema, "tool_calls": True, "template_problem": ""}


def describe_models(region: str, *, templates: bool = True, progress: Any = None) -> list[dict[str, Any]]:
    """The region's base models as dicts (see the module doc)."""
    from stepwise.aws.hub import base_models, hub_client
    from stepwise.core.prices import session_price

    client = hub_client(region)
    rows = []
    for model in base_models(region, client):
        price = session_price(model.name)
        row = {"model_id": model.model_id, "hub_content_name": model.name, "version": model.version,
               "base_model_arn": model.arn, "gated": model.gated, "tokenizer": model.hf_model_id,
               "session_usd_per_hour": price.usd_per_hour, "session_price_confirmed": price.confirmed,
               "session_price_source": price.source}
        if templates:
            if progress is not None:
                progress(f"reading {model.model_id}'s chat template (downloads its tokenizer files) ...")
            row.update(chat_template(model, client))
        rows.append(row)
    return rows


def _table(rows: list[dict[str, Any]], templates: bool) -> str:
    head = ["base_model_arn (hub content name)", "version", "model id", "gated", "session $/h"] + (
        ["chat template", "tool calls"] if templates else [])
    body = [[r["hub_content_name"], r["version"], r["model_id"],
             "yes: accept_eula" if r["gated"] else "no",
             f"{r['session_usd_per_hour']:g}" + ("" if r["session_price_confirmed"] else " (default: confirm)")]
            + ([r.get("chat_template") or "-", "parsed" if r.get("tool_calls") else "not parsed"] if templates else [])
            for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip() for line in [head, *body]]
    notes = [f"  {r['model_id']}: {r['template_problem']}" for r in rows if r.get("template_problem")]
    return "\n".join(lines + (["", "notes:", *notes] if notes else []))


def run(args: argparse.Namespace) -> int:
    import boto3

    region = args.region or boto3.session.Session().region_name
    if not region:
        from botocore.exceptions import NoRegionError

        raise NoRegionError()
    templates = not args.no_templates
    rows = describe_models(region, templates=templates,
                           progress=None if args.json else (lambda m: print(m, file=sys.stderr, flush=True)))
    if args.json:
        print(json.dumps({"region": region, "models": rows}, indent=2))
        return 0
    if not rows:
        print(f"the SageMaker Public Hub in {region} lists no base model for training sessions: try another region")
        return 1
    print(f"base models training sessions offer in {region} (SageMaker Public Hub):")
    print(_table(rows, templates))
    from stepwise.core.prices import SESSION_PRICE_HOWTO, SESSION_PRICES_AS_OF

    if not all(r["session_price_confirmed"] for r in rows):
        print(f"\nsession $/h: the price table of {SESSION_PRICES_AS_OF}; AWS publishes no per-hour figure for training "
              f"sessions, so a '(default: confirm)' figure is a high placeholder for session_usd_per_hour and "
              f"max_cost_usd: to read yours, {SESSION_PRICE_HOWTO}")
    print("\nput the hub content name (or the model's hub-content ARN, base_model_arn in --json, to pin its version) "
          "in the config's base_model_arn; a gated model also needs accept_eula: true (read its license first)")
    return 0
