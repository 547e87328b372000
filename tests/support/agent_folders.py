"""Agent folders outside the repository (copies of ``examples/agents/*``), and the stack synthesized with one as
its training runtime, checked by the tools we did not write (cdk-nag, cfn-lint, the IAM reference)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "agents"
FRAMEWORKS = ("strands", "langgraph")


def copy_example(framework: str, parent: Path) -> Path:
    """``examples/agents/{framework}`` copied to ``parent/{framework}-agent`` (a folder outside the repository)."""
    dest = parent / f"{framework}-agent"
    shutil.copytree(EXAMPLES / framework, dest)
    assert ROOT not in dest.resolve().parents, dest
    return dest


def synth_with_agent(folder: Path, *, concrete: bool = False, extra: dict[str, Any] | None = None):
    """``(stack, template, nag errors)`` of the app with ``-c agentDir=folder`` (and ``extra`` context); with
    ``concrete``, as ``cdk deploy`` synthesizes it (``CDK_DEFAULT_ACCOUNT`` / ``CDK_DEFAULT_REGION`` set)."""
    from aws_cdk import assertions

    from app import build_app
    from tests.support.stack import ACCOUNT, REGION

    saved = {k: os.environ.get(k) for k in ("CDK_DEFAULT_ACCOUNT", "CDK_DEFAULT_REGION")}
    try:
        if concrete:
            os.environ.update(CDK_DEFAULT_ACCOUNT=ACCOUNT, CDK_DEFAULT_REGION=REGION)
        else:
            for k in saved:
                os.environ.pop(k, None)
        _, stack = build_app({"agentDir": str(folder), **(extra or {})})
        template = assertions.Template.from_stack(stack).to_json()
        errors = assertions.Annotations.from_stack(stack).find_error(
            "*", assertions.Match.string_like_regexp("AwsSolutions-.*"))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return stack, template, [(e.id, str(e.entry.data)[:300]) for e in errors]


def cfn_lint_errors(template: dict) -> list[tuple[str, str]]:
    """cfn-lint's errors (and unaccepted warnings) on ``template``, as tests/infra/test_stack_validators.py runs it."""
    import cfnlint.api

    from tests.infra.test_stack_validators import ACCEPTED_CFN_LINT_WARNINGS, LINT_REGIONS

    matches = cfnlint.api.lint(json.dumps(template, indent=1), regions=LINT_REGIONS)
    return [(m.rule.id, m.message) for m in matches
            if m.rule.id.startswith("E") or (m.rule.id.startswith("W") and m.rule.id not in ACCEPTED_CFN_LINT_WARNINGS)]


def runtime_role_statements(template: dict, runtime_prefix: str = "Agent") -> tuple[dict, list[dict]]:
    """``(trust statement, policy statements)`` of the execution role of the runtime whose logical id starts with
    ``runtime_prefix``."""
    runtimes = {lid: r for lid, r in template["Resources"].items()
                if r["Type"] == "AWS::BedrockAgentCore::Runtime" and lid.startswith(f"{runtime_prefix}Runtime")}
    (runtime,) = runtimes.values()
    role = runtime["Properties"]["RoleArn"]["Fn::GetAtt"][0]
    (trust,) = template["Resources"][role]["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    statements = [st for r in template["Resources"].values() if r["Type"] == "AWS::IAM::Policy"
                  and any(ref.get("Ref") == role for ref in r["Properties"].get("Roles", []))
                  for st in r["Properties"]["PolicyDocument"]["Statement"]]
    return trust, statements
