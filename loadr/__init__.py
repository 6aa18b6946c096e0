"""loadr: a deterministic, resumable, multiprocess data loader.

Example::

    import loadr
    reader = loadr.open('data/train')                 # gulp, FFRecord or bag
    with loadr.Loader(reader, batch=64, seed=0, workers=4) as loader:
        for batch in loader:
            ...
"""

from . import errors, fns, readers, writers
from .check import Report, check
from .config import pipeline
from .errors import LoadrError
from .loader import Loader
from .mix import Mix
from .readers import open
from .shared import SharedList

__version__ = '0.1.0'

__all__ = ['Loader', 'Mix', 'open', 'check', 'Report', 'readers', 'writers', 'errors', 'fns',
           'LoadrError', 'pipeline', 'SharedList', '__version__']
