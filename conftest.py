"""pytest's doctest collection of loadr/: what cannot be imported here is left out.

``--doctest-modules`` imports every module of loadr/ to find its examples.
``loadr/__main__.py`` runs the command when imported, and the adapters for
optional packages (``loadr.torch``, ``loadr.jax``) import them: those are
left out when the package is not installed (their own tests skip then too).
"""

from __future__ import annotations

import importlib.util
import os

collect_ignore = ['loadr/__main__.py']
for _module, _needs in (('loadr/torch.py', 'torch'), ('loadr/jax.py', 'jax')):
    if importlib.util.find_spec(_needs) is None:
        collect_ignore.append(_module)
# JAX starts threads when it initialises, and this process forks loader workers in
# later tests (forking a multithreaded process can deadlock): loadr/jax.py's examples
# run in a child pytest started by tests/test_jax.py, which sets LOADR_JAX_DOCTESTS.
if not os.environ.get('LOADR_JAX_DOCTESTS') and 'loadr/jax.py' not in collect_ignore:
    collect_ignore.append('loadr/jax.py')
