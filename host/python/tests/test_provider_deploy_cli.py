"""agentix.cli.deploy: the pieces provider CLIs import (SPEC §10.7, §15)."""

import io
import json
import sys

import pytest

from agentix.cli.deploy import common_options, print_deploy_result
from agentix.provider import DeployedBundle

RESULT = DeployedBundle(
    bundle="/cache/sha256-ab",
    platform="linux/amd64",
    metadata={"name": "demo:1", "cache": "/cache/sha256-ab"},
    hints={"inspect contents": "ls -la /cache/sha256-ab/nix/", "remove from cache": "rm -rf /cache/sha256-ab"},
)


def _printed(result, fmt):
    out = io.StringIO()
    print_deploy_result(result, fmt, file=out)
    return out.getvalue()


def test_text_output():
    assert _printed(RESULT, "text") == (
        "bundle -> /cache/sha256-ab\n"
        "platform -> linux/amd64\n"
        "cache -> /cache/sha256-ab\n"
        "name -> demo:1\n"
        "\n"
        "# inspect contents\n"
        "ls -la /cache/sha256-ab/nix/\n"
        "# remove from cache\n"
        "rm -rf /cache/sha256-ab\n"
    )


def test_text_output_without_platform_or_hints():
    assert _printed(DeployedBundle(bundle="/b"), "text") == "bundle -> /b\n"


def test_json_output():
    assert json.loads(_printed(RESULT, "json")) == {
        "bundle": RESULT.bundle, "platform": "linux/amd64", "metadata": RESULT.metadata, "hints": RESULT.hints,
    }


def test_unknown_format():
    with pytest.raises(ValueError, match="text"):
        print_deploy_result(RESULT, "yaml")


def test_common_options_names_click_when_it_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "click", None)  # import click -> ImportError
    with pytest.raises(ImportError, match="python3-click"):
        common_options(lambda bundle, name, platform, output_format: None)
