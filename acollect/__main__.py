"""``python -m acollect``: the ``acollect`` command (``python -m acollect info``, ``python -m acollect bench``)."""

import sys

from acollect.cli.main import main

sys.exit(main())
