#!/bin/sh
echo "coverage unavailable offline: remote_coverage_tools is a local shim (third_party/README.md)" >&2
exit 1
