"""The training session statuses the pipeline acts on cover botocore's ``TrainingSessionStatus``
enum exactly: a status a newer botocore adds fails here until it is classified."""

from __future__ import annotations

import botocore.session

from stepwise.aws import sagemaker


def test_every_botocore_session_status_is_either_active_or_ended():
    model = botocore.session.get_session().get_service_model("sagemaker")
    statuses = set(model.shape_for("TrainingSessionStatus").enum)
    assert "Expired" in statuses
    assert sagemaker.ACTIVE_SESSION_STATUSES | sagemaker.ENDED_SESSION_STATUSES == statuses
    assert not sagemaker.ACTIVE_SESSION_STATUSES & sagemaker.ENDED_SESSION_STATUSES
    # the start wait ends at once on every ended status (and Blocked, as the SDK's own wait)
    assert sagemaker.ENDED_SESSION_STATUSES <= sagemaker.FAILED_SESSION_STATUSES
    assert sagemaker.RUNNING not in sagemaker.FAILED_SESSION_STATUSES
