"""``python -m loadr`` runs the ``loadr`` command.

Example::

    python -m loadr demo
"""

import sys

from .cli import main

sys.exit(main())
