"""``python -m stepwise.gateway --port N``: serve the gateway (see ``server.py``)."""

import sys

from .server import main

sys.exit(main())
