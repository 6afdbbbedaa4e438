"""``python -m trainguard`` is the ``trainguard`` command."""

import sys

from trainguard.cli import main

sys.exit(main())
