"""The state machine's placeholders and their values, shared by the stack and the local stack.

The ASL in ``state_machine/`` refers to deployed resources by ``${...}`` placeholders: one
``${<Name>FunctionArn}`` per entry of ``stepwise.functions.FUNCTIONS``, ``${BucketName}``, and one
per service integration (:data:`INTEGRATION_PLACEHOLDERS`: ``${StatesS3GetObject}`` is
``arn:PARTITION:states:::s3:getObject``), so the one text deploys to ``aws`` and ``aws-cn`` alike
(cdk.json targets both) and validators that know only ``arn:aws:`` see a whole substitution.
The CDK stack passes :func:`substitutions` (with CloudFormation tokens as values) to
``DefinitionSubstitutions``; the local stack passes the same function's result (with moto's
ARNs) to ``state_machine.definition.render_definition``. :func:`synthesized_definition`
reads a synthesized template back, so a test can prove both sides render the same text.

This module imports no CDK code: the local stack pays nothing for it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from state_machine.definition import GROUP_STATE_MACHINE_PLACEHOLDER, PLACEHOLDER_RE, placeholders
from stepwise.functions import FUNCTIONS

BUCKET_PLACEHOLDER = "BucketName"
#: Placeholder -> the Step Functions service integration it stands for (``arn:PARTITION:states:::X``).
INTEGRATION_PLACEHOLDERS = {
    "StatesLambdaInvoke": "lambda:invoke",
    "StatesLambdaInvokeWaitForTaskToken": "lambda:invoke.waitForTaskToken",
    "StatesS3GetObject": "s3:getObject",
    "StatesS3PutObject": "s3:putObject",
}


def integration_arn(integration: str, partition: str = "aws") -> str:
    """``arn:{partition}:states:::{integration}`` (``lambda:invoke``, ``s3:getObject``, ...)."""
    return f"arn:{partition}:states:::{integration}"


def function_placeholder(name: str) -> str:
    """The placeholder of the function ``name`` (a ``FUNCTIONS`` entry): ``<Name>FunctionArn``."""
    return f"{name}FunctionArn"


def substitutions(*, function_arns: Mapping[str, str], bucket_name: str, partition: str = "aws",
                  group_state_machine_arn: str | None = None) -> dict[str, str]:
    """Every placeholder the ASL may use, mapped to its value.

    Args:
        function_arns: logical function name (``FunctionSpec.name``) -> its ARN (a literal
            ARN locally, a CloudFormation token in the stack). Must cover every ``FUNCTIONS``
            entry; extra names are refused.
        bucket_name: the run bucket.
        partition: the AWS partition (the stack passes ``Aws.PARTITION``; locally ``aws``).
        group_state_machine_arn: the rollout group state machine's ARN (``${RolloutGroupStateMachineArn}``,
            which the training loop needs and the rollout group's own definition does not use).

    Returns:
        ``{"<Name>FunctionArn": arn, ..., "BucketName": bucket_name, "StatesS3GetObject":
        "arn:aws:states:::s3:getObject", ...}``.

    Raises:
        ValueError: a ``FUNCTIONS`` entry has no ARN, or an unknown name was given.
    """
    known = [spec.name for spec in FUNCTIONS]
    missing = [n for n in known if n not in function_arns]
    unknown = [n for n in function_arns if n not in known]
    if missing or unknown:
        raise ValueError(
            f"function_arns must name exactly the FUNCTIONS entries; missing {missing}, unknown {unknown}; "
            f"expected {known}"
        )
    subs = {function_placeholder(n): function_arns[n] for n in known}
    subs[BUCKET_PLACEHOLDER] = bucket_name
    if group_state_machine_arn is not None:
        subs[GROUP_STATE_MACHINE_PLACEHOLDER] = group_state_machine_arn
    subs.update({p: integration_arn(i, partition) for p, i in INTEGRATION_PLACEHOLDERS.items()})
    return subs


def used_substitutions(definition: str, subs: Mapping[str, Any]) -> dict[str, Any]:
    """The subset of ``subs`` that ``definition`` uses.

    Raises:
        ValueError: the definition uses a placeholder ``subs`` does not define (named).
    """
    used = placeholders(definition)
    undefined = sorted(used - set(subs))
    if undefined:
        raise ValueError(
            f"the state machine definition uses placeholders nobody defines: {undefined}; "
            f"defined: {sorted(subs)}"
        )
    return {k: v for k, v in subs.items() if k in used}


def _token_text(value: Any) -> str:
    """A CloudFormation value as stable text: ``Fn::GetAtt`` -> ``LogicalId.Attr``, ``Ref`` -> id,
    ``Fn::Join`` -> its parts joined (``arn:AWS::Partition:states:::s3:getObject``)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and set(value) == {"Fn::GetAtt"}:
        return ".".join(value["Fn::GetAtt"])
    if isinstance(value, dict) and set(value) == {"Ref"}:
        return value["Ref"]
    if isinstance(value, dict) and set(value) == {"Fn::Join"}:
        delimiter, parts = value["Fn::Join"]
        return delimiter.join(_token_text(p) for p in parts)
    return json.dumps(value, sort_keys=True)


#: How a definition is told apart in a template: its ``StartAt``.
MACHINE_STARTS = {"training_loop": "Initialize run", "rollout_group": "Roll out the group"}


def synthesized_substitutions(template: Mapping[str, Any], machine: str = "training_loop") -> dict[str, str]:
    """The ``DefinitionSubstitutions`` of the template's ``machine`` state machine (``training_loop`` or
    ``rollout_group``), tokens as text.

    ``{"InitFunctionArn": "FunctionsInitFunction1234.Arn", "BucketName": "StorageBucket5678", ...}``.

    Raises:
        ValueError: the template has no such state machine, or more than one.
    """
    found = _the_state_machine(template, machine)
    return {k: _token_text(v) for k, v in (found.get("DefinitionSubstitutions") or {}).items()}


def synthesized_definition(template: Mapping[str, Any], machine: str = "training_loop") -> str:
    """The template's ``machine`` state machine definition with every placeholder replaced by its token text.

    Equal to ``render_definition(synthesized_substitutions(template))`` when the deployed
    definition is the ASL file (the property the local stack's equality test relies on).
    """
    found = _the_state_machine(template, machine)
    text = found["DefinitionString"]
    if not isinstance(text, str):
        raise ValueError("DefinitionString is not a literal string; the stack must use DefinitionBody.from_string")
    subs = synthesized_substitutions(template, machine)
    return PLACEHOLDER_RE.sub(lambda m: subs.get(m.group(1), m.group(0)), text)


def _the_state_machine(template: Mapping[str, Any], machine: str = "training_loop") -> Mapping[str, Any]:
    start = MACHINE_STARTS[machine]
    machines = [
        r["Properties"]
        for r in template.get("Resources", {}).values()
        if r.get("Type") == "AWS::StepFunctions::StateMachine"
        and isinstance(r["Properties"].get("DefinitionString"), str)
        and json.loads(r["Properties"]["DefinitionString"]).get("StartAt") == start
    ]
    if len(machines) != 1:
        raise ValueError(f"expected exactly one {machine} AWS::StepFunctions::StateMachine (StartAt {start!r}) in the "
                         f"template, found {len(machines)}")
    return machines[0]
