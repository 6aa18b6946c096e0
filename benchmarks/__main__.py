"""``python -m benchmarks``: every workload, loadr against its peers; see benchmarks/run.py."""

import sys

from .run import main

if __name__ == '__main__':
    sys.exit(main())
