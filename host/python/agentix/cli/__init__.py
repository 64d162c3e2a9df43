"""Command-line pieces shared with plugins (`agentix.cli.deploy`). A
``pkgutil`` namespace package, so plugin distributions may add siblings."""

from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)
