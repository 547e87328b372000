"""The app synthesized the way ``cdk deploy`` synthesizes it, and checked as the CLI checks it.

``cdk deploy`` runs the app through the CDK CLI with ``CDK_DEFAULT_ACCOUNT`` and ``CDK_DEFAULT_REGION``
set (the CLI sets them whenever it has credentials; docs/first-run.md exports them too), so the stack is
environment-specific and every ARN it builds carries the literal account and region; the CLI refuses a
stack whose synthesis left an error (a cdk-nag finding without a suppression). The in-process tests
(tests/support/stack.py) synthesize the environment-agnostic app; this module runs the CLI itself: the
npm ``aws-cdk`` package pinned in tools/package.json and its lock (``make install-dev`` runs ``npm ci``
there), with both variables set to a concrete account and region, ``cdk synth`` with

- no options;
- every context value the stack reads (:data:`EVERY_OPTION`, the keys of docs/deploy.md's table);
- each ``cdk deploy`` / ``cdk synth`` command of docs/first-run.md, its options read from the page
  (the page runs the same pinned CLI: it puts tools/node_modules/.bin on PATH).

Each must synthesize with no error (no cdk-nag error) and a template cfn-lint finds no error in. CI has
no AWS credentials: the runs have none (the credential files point nowhere, the variables are unset,
the instance metadata service is off) and, where ``unshare`` can make one, run in a network namespace
with no network, so a synthesis that needed a lookup or any AWS call would fail here. The variants
run in parallel subprocesses (about 10 s of CPU each).
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from infra.settings import StackSettings
from tests.infra.test_stack_validators import ACCEPTED_CFN_LINT_WARNINGS, require
from tests.support.stack import ACCOUNT, REGION, SCOPED_CONTEXT

ROOT = Path(__file__).resolve().parents[2]
CLI = ROOT / "tools" / "node_modules" / ".bin" / "cdk"
FIRST_RUN = ROOT / "docs" / "first-run.md"
DEPLOY_MD = ROOT / "docs" / "deploy.md"

#: Every context value the stack reads, each set to a value other than its default: the scoped
#: context of the in-process tests and the values cdk.json gives defaults for.
EVERY_OPTION: dict[str, str] = {
    **{k: str(v) for k, v in SCOPED_CONTEXT.items()},
    "bulkRetentionDays": "7", "stallMinutes": "30", "rolloutFailureRateAlarm": "0.25", "logRetentionDays": "14",
    "destroyOnDelete": "true", "sweepMinutes": "10",
    "agentDir": str(ROOT / "examples" / "agents" / "strands"), "agentEntrypoint": "agent:app",
    "agentRequirements": "requirements.txt",
    "huggingFaceTokenSecretArn": f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:stepwise-hf-token-AbCdEf",
    "judgeModelIds": "us.amazon.nova-micro-v1:0,anthropic.claude-3-haiku-20240307-v1:0",
}


def context_keys() -> list[str]:
    """The context keys the app reads (``StackSettings.from_context`` and app.py's ``stackName``)."""
    asked: list[str] = ["stackName"]
    StackSettings.from_context(lambda key: asked.append(key))
    return asked


# --- the page's commands ----------------------------------------------------------------


def bash_lines(page: Path) -> list[list[str]]:
    """Each command line of the page's ``bash`` blocks, split as the shell splits it (comments dropped)."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", page.read_text(), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                out.append(words)
    return out


def cdk_commands(page: Path) -> list[list[str]]:
    """The page's ``cdk deploy`` and ``cdk synth`` commands, as word lists from ``cdk`` on."""
    return [words for words in bash_lines(page) if words[0] == "cdk" and len(words) > 1 and words[1] in ("deploy", "synth")]


def context_options(words: list[str]) -> dict[str, str]:
    """``-c key=value`` / ``--context key=value`` of a ``cdk`` command; ValueError on any other option."""
    out, rest = {}, words[2:]
    while rest:
        flag, rest = rest[0], rest[1:]
        if flag not in ("-c", "--context") or not rest or "=" not in rest[0]:
            raise ValueError(f"{shlex.join(words)}: only -c key=value options are synthesized here, not {flag!r}")
        key, value = rest[0].split("=", 1)
        out[key], rest = value, rest[1:]
    return out


def exported(page: Path) -> dict[str, str]:
    """``NAME=VALUE`` of the page's ``export`` lines, values as written (``$ACCOUNT`` stays)."""
    out = {}
    for words in bash_lines(page):
        if words[0] == "export":
            out.update(w.split("=", 1) for w in words[1:] if "=" in w)
    return out


def variants() -> dict[str, dict[str, str]]:
    """Name -> the context options of one ``cdk synth``: none, every option, and each command of first-run.md."""
    out: dict[str, dict[str, str]] = {"no options": {}, "every option": EVERY_OPTION}
    for words in cdk_commands(FIRST_RUN):
        options = context_options(words)
        if options not in out.values():
            out[f"first-run.md: {shlex.join(words)}"] = options
    return out


# --- running the CLI --------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def no_network_prefix() -> tuple[str, ...]:
    """``("unshare", "--net")`` where it can make a network namespace here (root, or user namespaces)."""
    for prefix in (("unshare", "--net"), ("unshare", "--map-root-user", "--net")):
        if shutil.which(prefix[0]) and subprocess.run([*prefix, "true"], capture_output=True).returncode == 0:
            return prefix
    return ()


def cli_environment(tmp: Path) -> dict[str, str]:
    """The environment of ``cdk deploy`` per docs/first-run.md, with no AWS credentials of any kind.

    The venv's python first on PATH (the page's ``source .venv/bin/activate``; cdk.json runs
    ``python app.py``), ``AWS_REGION`` and the two CDK variables as the page exports them, the account
    a placeholder (the page's comes from ``aws sts get-caller-identity``). The CLI itself sets
    ``CDK_DEFAULT_REGION`` from ``AWS_REGION`` and, with credentials, ``CDK_DEFAULT_ACCOUNT`` from STS.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "CDK_", "AMAZON_"))}
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        AWS_REGION=REGION, CDK_DEFAULT_REGION=REGION, CDK_DEFAULT_ACCOUNT=ACCOUNT,
        AWS_CONFIG_FILE=str(tmp / "no-aws-config"), AWS_SHARED_CREDENTIALS_FILE=str(tmp / "no-aws-credentials"),
        AWS_EC2_METADATA_DISABLED="true", CDK_DISABLE_CLI_TELEMETRY="true",
        JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION="1",
    )
    return env


@dataclass
class Synth:
    """One ``cdk synth`` run: its exit code, output, and the cloud assembly it wrote."""

    command: list[str]
    returncode: int
    output: str
    outdir: Path

    @functools.cached_property
    def manifest(self) -> dict:
        return json.loads((self.outdir / "manifest.json").read_text())

    @property
    def stack_artifact(self) -> dict:
        (artifact,) = [a for a in self.manifest["artifacts"].values() if a["type"] == "aws:cloudformation:stack"]
        return artifact

    def errors(self) -> list[str]:
        """Every error the synthesis left in the assembly (what makes the CLI refuse the stack), as path: message."""
        return [f"{path}: {str(entry.get('data'))[:240]}" for path, entries in self.stack_artifact.get("metadata", {}).items()
                for entry in entries if entry.get("type") == "aws:cdk:error"]

    def template(self) -> dict:
        return json.loads((self.outdir / self.stack_artifact["properties"]["templateFile"]).read_text())


def run_synth(options: dict[str, str], outdir: Path, env: dict[str, str]) -> Synth:
    context = [w for k, v in options.items() for w in ("-c", f"{k}={v}")]
    command = [*no_network_prefix(), str(CLI), "synth", *context, "--no-notices", "--quiet", "--output", str(outdir)]
    out = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    return Synth(command, out.returncode, out.stdout + out.stderr, outdir)


@pytest.fixture(scope="module")
def synths(tmp_path_factory) -> dict[str, Synth]:
    """Every variant synthesized by the CLI, in parallel."""
    require(CLI.exists() and shutil.which("node") is not None, "the CDK CLI (tools/, npm ci)")
    tmp = tmp_path_factory.mktemp("cdk")
    env = cli_environment(tmp)
    todo = variants()
    with concurrent.futures.ThreadPoolExecutor(len(todo)) as pool:
        futures = {name: pool.submit(run_synth, options, tmp / f"out{i}", env) for i, (name, options) in enumerate(todo.items())}
        return {name: f.result() for name, f in futures.items()}


VARIANTS = list(variants())


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_cli_synthesizes_the_environment_specific_stack_with_no_nag_error(synths, variant):
    synth = synths[variant]
    assert synth.returncode == 0, f"{shlex.join(synth.command)} failed:\n{synth.output[-6000:]}"
    assert synth.errors() == []
    assert synth.stack_artifact["environment"] == f"aws://{ACCOUNT}/{REGION}"
    # the literal account and region are in the grants (the form the suppressions must accept too)
    assert f"{REGION}:{ACCOUNT}" in json.dumps(synth.template())


@pytest.mark.parametrize("variant", VARIANTS)
def test_cfn_lint_finds_no_error_in_the_template_the_cli_synthesized(synths, variant):
    try:
        import cfnlint.api
    except ImportError:
        require(False, "cfn-lint")
    synth = synths[variant]
    assert synth.returncode == 0, synth.output[-3000:]
    matches = cfnlint.api.lint(json.dumps(synth.template(), indent=1), regions=[REGION])
    findings = [(m.rule.id, m.message, m.linenumber) for m in matches]
    assert [f for f in findings if f[0].startswith("E")] == []
    assert [f for f in findings if f[0].startswith("W") and f[0] not in ACCEPTED_CFN_LINT_WARNINGS] == []


def test_synthesis_needs_no_credentials_and_makes_no_lookup(synths):
    """No context lookup is missing from any assembly (a ``fromLookup`` without credentials leaves one, and
    the CLI would need an account to fill it), and the runs had no credentials: the synth is what CI can prove."""
    for name, synth in synths.items():
        assert synth.returncode == 0, name
        assert "missing" not in synth.manifest, (name, synth.manifest.get("missing"))
    env = cli_environment(Path("/nonexistent"))
    assert not any(k in env for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                                      "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_WEB_IDENTITY_TOKEN_FILE"))


def test_every_option_sets_every_context_value_the_stack_reads():
    keys = context_keys()
    assert sorted(set(keys) - set(EVERY_OPTION)) == []
    table = {line.split("|")[1].strip().strip("`") for line in DEPLOY_MD.read_text().splitlines() if line.startswith("| `")}
    assert set(EVERY_OPTION) <= table


def test_first_run_md_deploys_with_the_cli_and_the_environment_ci_synthesizes_with():
    """The page's deploy is one of the variants above, run by the pinned CLI, in the environment CI sets."""
    commands = cdk_commands(FIRST_RUN)
    assert any(words[1] == "deploy" for words in commands), commands
    for words in commands:
        assert set(context_options(words)) <= set(context_keys()), words
    env = exported(FIRST_RUN)
    assert {"AWS_REGION", "CDK_DEFAULT_ACCOUNT", "CDK_DEFAULT_REGION"} <= set(env), env
    assert env["AWS_REGION"] == REGION and env["CDK_DEFAULT_REGION"] == "$AWS_REGION"
    assert "tools/node_modules/.bin" in env.get("PATH", ""), "first-run.md must run the CDK CLI pinned in tools/"
    assert not any(words[:2] == ["npm", "install"] and "aws-cdk" in words for words in bash_lines(FIRST_RUN))


def test_the_page_parsers_read_what_the_shell_would():
    """`cdk_commands` and `context_options` on a page like first-run.md (a test of the test's reader)."""
    words = shlex.split("cdk deploy -c createSageMakerRole=true --context deployMathAgent=true  # a comment",
                        comments=True)
    assert context_options(words) == {"createSageMakerRole": "true", "deployMathAgent": "true"}
    with pytest.raises(ValueError, match="--require-approval"):
        context_options(shlex.split("cdk deploy --require-approval never"))


def test_the_cli_is_pinned_in_tools():
    package = json.loads((ROOT / "tools" / "package.json").read_text())
    lock = json.loads((ROOT / "tools" / "package-lock.json").read_text())
    pinned = package["devDependencies"]["aws-cdk"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", pinned)
    assert lock["packages"]["node_modules/aws-cdk"]["version"] == pinned
