"""The one build step pyproject.toml cannot declare stably: the gateway's C extensions.

gateway/speedups.py and gateway/sockio.py say why they exist. `optional=True`: where one does not
compile (no C compiler; the socket shim is Linux-only), the install goes on and the gateway runs
without it (the relay's Python twins; socket I/O through read/write).
"""

from setuptools import Extension, setup

FLAGS = ["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers"]

setup(ext_modules=[
    Extension("gateway._speedups", sources=["gateway/_speedups.c"], optional=True,
              extra_compile_args=FLAGS),
    # Not a Python module (no PyInit): a plain shared library, preloaded by path.
    Extension("gateway._sockio", sources=["gateway/_sockio.c"], optional=True,
              extra_compile_args=FLAGS),
])
