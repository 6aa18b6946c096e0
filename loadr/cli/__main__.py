"""``python -m loadr.cli`` runs the ``loadr`` command (as ``python -m loadr`` does).

Example::

    python -m loadr.cli demo
"""

import sys

from . import main

if __name__ == '__main__':
    sys.exit(main())
