"""``python -m acollect.cli``: the ``acollect`` command."""

import sys

from acollect.cli.main import main

sys.exit(main())
