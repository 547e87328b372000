"""cdk-nag's AwsSolutions checks, and the suppressions made to hold in an environment-specific stack.

The suppressions of this app (``NagSuppressions.add_resource_suppressions`` / ``add_stack_suppressions``
in each construct) name ARNs as cdk-nag prints them from an environment-agnostic stack:
``arn:<AWS::Partition>:sagemaker:<AWS::Region>:<AWS::AccountId>:model-package/*``. The CDK CLI sets
``CDK_DEFAULT_ACCOUNT`` and ``CDK_DEFAULT_REGION`` whenever it has credentials (``cdk deploy``), and the
app then makes the stack environment-specific (``app.build_app``): ``Stack.format_arn`` writes the
literal account and region, the finding becomes ``arn:<AWS::Partition>:sagemaker:us-west-2:111122223333:
model-package/*``, and a suppression in the token form no longer applies (30 AwsSolutions-IAM5 errors
with no options, 34 with docs/first-run.md's; the CLI refuses a stack with errors).

`ConcreteEnvironmentSuppressions` derives, for every suppression that names a pseudo parameter
(:data:`PSEUDO_PARAMETERS`), one that accepts both the token and the stack's literal value of each, with
the same rule and reason, just before the checks run. So each suppression is written once, in the
token form, and holds in both kinds of stack; a literal value of another account or region is never
accepted. It reads the suppressions where cdk-nag keeps them (the ``cdk_nag`` metadata of each
CfnResource and of the stack's template, the format the synthesized template shows) and adds the
derived ones through cdk-nag's own API.
"""

from __future__ import annotations

import base64
import re
from typing import Any

import aws_cdk as cdk
import jsii
from cdk_nag import AwsSolutionsChecks, NagSuppressions
from constructs import IConstruct

#: The pseudo parameters cdk-nag prints as ``<AWS::NAME>`` in a finding, and the Stack attribute that
#: holds the literal value in an environment-specific stack.
PSEUDO_PARAMETERS = {
    "<AWS::Region>": "region",
    "<AWS::AccountId>": "account",
    "<AWS::Partition>": "partition",
    "<AWS::URLSuffix>": "url_suffix",
}
_PSEUDO_RE = re.compile("|".join(re.escape(p) for p in PSEUDO_PARAMETERS))
#: A cdk-nag ``appliesTo`` regex: ``/PATTERN/FLAGS`` (cdk-nag's NagSuppressionHelper.toRegEx).
_NAG_REGEX = re.compile(r"^/(.*)/([a-z]*)$", re.S)


def literal_environment(stack: cdk.Stack) -> dict[str, str]:
    """``{"<AWS::Region>": "us-west-2", ...}``: each pseudo parameter the stack knows literally (none in an
    environment-agnostic stack, where each is a token)."""
    out = {}
    for placeholder, attribute in PSEUDO_PARAMETERS.items():
        value = getattr(stack, attribute)
        if isinstance(value, str) and not cdk.Token.is_unresolved(value):
            out[placeholder] = value
    return out


def accept_literal(applies_to: str | dict[str, str], literals: dict[str, str]) -> dict[str, str] | None:
    """The ``appliesTo`` entry that matches what ``applies_to`` matches, with each pseudo parameter also
    accepted as its literal value (``<AWS::Region>`` -> ``(?:<AWS::Region>|us-west-2)``); None when
    ``applies_to`` names none of ``literals``.

    ``applies_to``: a finding (``"Resource::arn:..."``, matched exactly) or ``{"regex": "/PATTERN/FLAGS"}``.
    Raises ValueError on a regex entry cdk-nag would refuse too.
    """
    if isinstance(applies_to, str):
        # the finding's text escaped, its placeholders kept as written (odd items of the split)
        pieces = re.split(f"({_PSEUDO_RE.pattern})", applies_to)
        pattern, flags = "^" + "".join(p if i % 2 else _escape(p) for i, p in enumerate(pieces)) + "$", ""
    else:
        m = _NAG_REGEX.match(applies_to.get("regex", ""))
        if m is None:
            raise ValueError(f"not a cdk-nag appliesTo regex: {applies_to!r}")
        pattern, flags = m.group(1), m.group(2)
    if not any(p in pattern for p in literals):
        return None
    derived = _PSEUDO_RE.sub(
        lambda m: f"(?:{m.group(0)}|{_escape(literals[m.group(0)])})" if m.group(0) in literals else m.group(0),
        pattern)
    return {"regex": f"/{derived}/{flags}"}


def _escape(text: str) -> str:
    """``text`` matched literally by a JavaScript regex (cdk-nag evaluates the patterns in Node)."""
    return re.sub(r"([\\^$.|?*+()\[\]{}/])", r"\\\1", text)


def derived_suppressions(rules: list[dict[str, Any]], literals: dict[str, str]) -> list[dict[str, Any]]:
    """For each suppression of ``rules`` (cdk-nag's metadata form: ``id``, ``reason``, ``applies_to``) whose
    findings name a pseudo parameter, the suppression (API form: ``appliesTo``) that also accepts its
    literal value. Same rule id and reason; suppressions without ``applies_to`` need none."""
    out = []
    for rule in rules:
        if not literals or not rule.get("applies_to"):
            continue
        derived = [d for d in (accept_literal(a, literals) for a in rule["applies_to"]) if d is not None]
        if derived:
            reason = rule["reason"]
            if rule.get("is_reason_encoded"):  # cdk-nag stores a reason with non-Latin-1 characters in base64
                reason = base64.b64decode(reason).decode()
            out.append({"id": rule["id"], "reason": reason, "appliesTo": derived})
    return out


@jsii.implements(cdk.IAspect)
class ConcreteEnvironmentSuppressions:
    """Adds `derived_suppressions` to every CfnResource and stack it visits (see the module docstring).

    Added with `cdk.AspectPriority.MUTATING`, so on every construct it runs before cdk-nag's checks
    (`cdk.AspectPriority.DEFAULT`); a stack is visited before its resources.
    """

    def visit(self, node: IConstruct) -> None:
        if isinstance(node, cdk.Stack):
            literals = literal_environment(node)
            rules = ((node.template_options.metadata or {}).get("cdk_nag") or {}).get("rules_to_suppress") or []
            derived = derived_suppressions(rules, literals)
            if derived:
                NagSuppressions.add_stack_suppressions(node, derived)
        elif isinstance(node, cdk.CfnResource):
            literals = literal_environment(cdk.Stack.of(node))
            rules = (node.get_metadata("cdk_nag") or {}).get("rules_to_suppress") or []
            derived = derived_suppressions(rules, literals)
            if derived:
                NagSuppressions.add_resource_suppressions(node, derived)


def apply_checks(app: cdk.App) -> None:
    """cdk-nag's AwsSolutions rules on every construct of ``app`` (findings become synth errors), with every
    suppression accepting both forms of each ARN (`ConcreteEnvironmentSuppressions`)."""
    cdk.Aspects.of(app).add(ConcreteEnvironmentSuppressions(), priority=cdk.AspectPriority.MUTATING)
    cdk.Aspects.of(app).add(AwsSolutionsChecks(verbose=True))
