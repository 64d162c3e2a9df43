"""`PodmanProvider`: `agentix.provider.docker.DockerProvider` on the provider
service's podman backend (see `agentix.provider.docker`)."""

from agentix.provider.docker import PodmanProvider, PodmanProviderConfig

__all__ = ["PodmanProvider", "PodmanProviderConfig"]
