"""``python -m slipstream ...`` is the ``slipstream`` command."""

import sys

from slipstream.cli import main

sys.exit(main())
