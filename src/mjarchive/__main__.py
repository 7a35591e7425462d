"""`python -m mjarchive` runs the command line (same as the `mjarchive` console script)."""

import sys

from ._cli import main

sys.exit(main())
