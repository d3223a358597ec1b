"""``python -m kvhit.cli``."""

import sys

from kvhit.cli import main

sys.exit(main())
