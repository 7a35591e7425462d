"""`python -m mjarchive` runs the command line (same as the `mjarchive` console script)."""

import sys

from .cli.main import main

sys.exit(main())
