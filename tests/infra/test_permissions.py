"""The IAM scopes follow the names the handlers really use."""

from __future__ import annotations

import fnmatch

from hypothesis import given, strategies as st

from infra.permissions import SDK_DEFAULT_MODEL_PACKAGE_GROUP, SESSION_NAME_PATTERN
from stepwise.core.phases import session_name_for


@given(st.text(min_size=1, max_size=80))
def test_every_session_name_init_can_choose_is_inside_the_granted_pattern(run_id):
    assert fnmatch.fnmatchcase(session_name_for(run_id), SESSION_NAME_PATTERN)


def test_the_sdk_default_model_package_group_is_the_one_granted():
    from sagemaker.train.training_session.service_client import DEFAULT_MODEL_PACKAGE_GROUP_NAME

    assert SDK_DEFAULT_MODEL_PACKAGE_GROUP == DEFAULT_MODEL_PACKAGE_GROUP_NAME
