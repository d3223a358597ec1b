"""``python -m kvhit.cli``."""

import sys

from . import main

sys.exit(main())
