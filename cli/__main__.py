"""``python -m rocketstore.cli``: the ``rocketstore`` command."""

import sys

from rocketstore.cli.main import main

sys.exit(main())
