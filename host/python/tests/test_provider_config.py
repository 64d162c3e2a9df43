"""SandboxConfig / SandboxResource validation (SPEC §9.1)."""

import math
from pathlib import Path

import pytest

from agentix.provider import SandboxConfig, SandboxResource


def test_required_fields_and_defaults():
    with pytest.raises(TypeError):
        SandboxConfig(image="img")  # bundle is required
    config = SandboxConfig(image="img", bundle="/b")
    assert (config.platform, config.env, config.resource) == (None, None, None)
    assert config.model_dump() == {"image": "img", "bundle": "/b", "platform": None, "env": None, "resource": None}


def test_paths_are_accepted_as_strings():
    assert SandboxConfig(image="host", bundle=Path("/b")).bundle == "/b"


@pytest.mark.parametrize("field", ["image", "bundle"])
def test_image_and_bundle_must_be_strings(field):
    values = {"image": "i", "bundle": "b", field: 3}
    with pytest.raises(ValueError, match=f"SandboxConfig.{field} must be a string"):
        SandboxConfig(**values)


@pytest.mark.parametrize("env", [{"A": 1}, {1: "a"}, {"": "x"}, {"A=B": "x"}, ["A"]])
def test_env_must_map_names_to_strings(env):
    with pytest.raises(ValueError, match="SandboxConfig.env"):
        SandboxConfig(image="i", bundle="b", env=env)


def test_blank_platform_is_refused():
    with pytest.raises(ValueError, match="platform"):
        SandboxConfig(image="i", bundle="b", platform=" ")


def test_resource_from_a_dict():
    config = SandboxConfig(image="i", bundle="b", resource={"memory": "16g", "cpu": 2})
    assert config.resource == SandboxResource(cpu=2.0, memory="16g")


def test_resource_of_another_type_is_refused():
    with pytest.raises(ValueError, match="resource"):
        SandboxConfig(image="i", bundle="b", resource="16g")


def test_valid_resources():
    resource = SandboxResource(cpu=0.5, memory=1 << 30, gpu=1)
    assert (resource.cpu, resource.memory, resource.gpu) == (0.5, 1 << 30, 1)
    assert SandboxResource(memory="512m").memory == "512m"
    assert SandboxResource().model_dump() == {"cpu": None, "memory": None, "gpu": None}


@pytest.mark.parametrize("cpu", [0, -1, "2", True, math.nan, math.inf])
def test_cpu_must_be_a_positive_number(cpu):
    with pytest.raises(ValueError, match="SandboxResource.cpu"):
        SandboxResource(cpu=cpu)


@pytest.mark.parametrize("memory", [0, -5, "", "   ", 1.5, True])
def test_memory_must_be_positive_bytes_or_a_non_blank_string(memory):
    with pytest.raises(ValueError, match="SandboxResource.memory"):
        SandboxResource(memory=memory)


@pytest.mark.parametrize("gpu", [0, -1, 1.0, True])
def test_gpu_must_be_a_positive_integer(gpu):
    with pytest.raises(ValueError, match="SandboxResource.gpu"):
        SandboxResource(gpu=gpu)
