"""`python -m sweep`: the command line, as the `sweep` script runs it."""

import sys

from .cli import main

sys.exit(main())
