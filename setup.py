"""The optional C extension loadr._jpegregion (region decoding of JPEGs, loadr.decode).

Everything else is in pyproject.toml. The extension needs libjpeg-turbo's header and
library (Debian/Ubuntu: ``apt-get install libjpeg62-turbo-dev`` or ``libjpeg-turbo8-dev``);
without them the build of the extension fails quietly (``optional=True``), loadr installs
without it and the fused decode uses simplejpeg instead.
"""

import sys

from setuptools import Extension, setup

# No fused multiply-adds: the resize's weights must round as numpy's (the fallback) do.
FLAGS = [] if sys.platform == 'win32' else ['-ffp-contract=off']

setup(ext_modules=[Extension('loadr._jpegregion', ['loadr/_jpegregion.c'], libraries=['jpeg'],
                             extra_compile_args=FLAGS, optional=True)])
