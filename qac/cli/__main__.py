"""``python -m qac.cli``: the ``qac`` command."""

import sys

from qac.cli import main

sys.exit(main())
