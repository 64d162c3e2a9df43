"""A stand-in for agentix whose import takes SLOW_IMPORT_S seconds: the worker
must send ready and run calls that do not import it meanwhile
(worker/driver/deferred.py; worker_traces_test)."""

import time

SLOW_IMPORT_S = 5.0

time.sleep(SLOW_IMPORT_S)

# As the real package: its __init__ imports its submodules, which import
# the package (worker_traces_test: the warm-up's import order).
from agentix.utils import trace  # noqa: E402,F401
