"""Host- and sandbox-side utilities (`context`). A ``pkgutil`` namespace
package: plugin distributions may add siblings."""

from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)
