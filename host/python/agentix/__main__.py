"""``python -m agentix``: the ``agentix`` command (`agentix.cli.main`)."""

import sys

from agentix.cli.main import main

sys.exit(main())
