"""Operator commands without AWS setup end with one clear line and exit code 2, not a traceback."""

from __future__ import annotations

from stepwise_cli import main as cli


def test_no_region_is_one_clear_line(monkeypatch, capsys):
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/config")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials")
    assert cli.main(["runs"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("stepwise runs: no AWS region configured") and "Traceback" not in err


def test_other_errors_still_raise():
    from botocore.exceptions import NoCredentialsError

    assert cli._aws_setup_error(NoCredentialsError()).startswith("no AWS credentials found")
    assert cli._aws_setup_error(ValueError("x")) is None
