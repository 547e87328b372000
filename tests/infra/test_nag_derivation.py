"""`infra.nag.accept_literal` over arbitrary findings and environments (hypothesis).

The derived ``appliesTo`` entry matches exactly what the original matches with each pseudo parameter
written either as cdk-nag prints it in an environment-agnostic stack (``<AWS::Region>``) or as the
stack's literal value, and nothing with another value. cdk-nag evaluates the patterns with JavaScript's
RegExp; the constructs used (literal text with backslash escapes, ``(?:a|b)``, ``^``, ``$``) mean the same
in Python's ``re``, which checks them here (tests/infra/test_stack_nag.py checks them in cdk-nag itself).
"""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from infra.nag import PSEUDO_PARAMETERS, accept_literal, derived_suppressions

PLACEHOLDERS = sorted(PSEUDO_PARAMETERS)
regions = st.from_regex(r"[a-z]{2}(-[a-z]{2,9}){1,2}-[1-9]", fullmatch=True)
accounts = st.from_regex(r"[0-9]{12}", fullmatch=True)
#: finding text between placeholders: any printable text, regex metacharacters and '/' included
texts = st.text(st.characters(min_codepoint=32, max_codepoint=126, blacklist_characters="<>"), max_size=12)
findings = st.lists(st.tuples(texts, st.sampled_from(PLACEHOLDERS)), min_size=1, max_size=4).map(
    lambda parts: [p for pair in parts for p in pair])


def _nag_regex(entry: dict[str, str]) -> re.Pattern:
    m = re.fullmatch(r"/(.*)/([a-z]*)", entry["regex"], re.S)
    assert m is not None and m.group(2) == ""
    return re.compile(m.group(1), re.S)


def _literals(region: str, account: str) -> dict[str, str]:
    return {"<AWS::Region>": region, "<AWS::AccountId>": account, "<AWS::Partition>": "aws",
            "<AWS::URLSuffix>": "amazonaws.com"}


@given(findings, regions, accounts, st.data())
def test_a_finding_entry_accepts_both_forms_of_each_placeholder_and_nothing_else(parts, region, account, data):
    literals = _literals(region, account)
    finding = "Resource::" + "".join(parts)
    derived = _nag_regex(accept_literal(finding, literals))
    # each placeholder written as the token or as the literal, chosen independently
    mixed = "Resource::" + "".join(
        (literals[p] if data.draw(st.booleans()) else p) if p in literals else p for p in parts)
    assert derived.search(finding) and derived.search(mixed)
    wrong = "Resource::" + "".join(("000000000000" if p == "<AWS::AccountId>" and account != "000000000000"
                                    else literals.get(p, p)) for p in parts)
    if "<AWS::AccountId>" in parts and account != "000000000000":
        assert not derived.search(wrong)
    assert not derived.search(finding + "x") and not derived.search("x" + finding)


@given(regions, accounts)
def test_a_regex_entry_keeps_its_pattern_and_accepts_the_literal_values(region, account):
    entry = {"regex": "/^Resource::arn:<AWS::Partition>:states:<AWS::Region>:<AWS::AccountId>:execution:.*\\*$/"}
    derived = _nag_regex(accept_literal(entry, _literals(region, account)))
    assert derived.search(f"Resource::arn:<AWS::Partition>:states:{region}:{account}:execution:<SM.Name>:*")
    assert derived.search("Resource::arn:<AWS::Partition>:states:<AWS::Region>:<AWS::AccountId>:execution:x/*")
    assert not derived.search(f"Resource::arn:<AWS::Partition>:states:{region}:{account}:execution:<SM.Name>:x")


def test_entries_without_a_placeholder_or_without_a_literal_environment_derive_nothing():
    assert accept_literal("Resource::*", _literals("us-west-2", "111122223333")) is None
    assert accept_literal({"regex": "/^Resource::<StorageBucket[0-9A-F]+\\.Arn>\\/runs\\/.*$/"},
                          _literals("us-west-2", "111122223333")) is None
    rules = [{"id": "AwsSolutions-IAM5", "reason": "why", "applies_to": ["Resource::arn:<AWS::Region>:x"]},
             {"id": "AwsSolutions-L1", "reason": "no findings"}]
    assert derived_suppressions(rules, {}) == []
    (one,) = derived_suppressions(rules, {"<AWS::Region>": "eu-west-1"})
    assert (one["id"], one["reason"]) == ("AwsSolutions-IAM5", "why")
    assert _nag_regex(one["appliesTo"][0]).search("Resource::arn:eu-west-1:x")
