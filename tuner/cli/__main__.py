"""``python -m tunecache.tuner.cli``: the ``tunecache`` command."""

import sys

from tunecache.tuner.cli import main

sys.exit(main())
