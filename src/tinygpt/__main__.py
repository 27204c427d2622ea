"""``python -m tinygpt``: the same command line as the ``tinygpt`` script (``tinygpt.cli``)."""

import sys

from tinygpt.cli import main

if __name__ == "__main__":
    sys.exit(main())
