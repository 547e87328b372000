"""`python -m stepwise_cli ...`: the same as the `stepwise` console script."""

import sys

from stepwise_cli.main import main

sys.exit(main())
