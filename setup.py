"""The one build step pyproject.toml cannot declare stably: the gateway's C socket shim.

gateway/sockio.py says why it exists. `optional=True`: where it does not compile (no C compiler;
it is Linux-only), the install goes on and the gateway's socket I/O goes through read/write.
"""

from setuptools import Extension, setup

FLAGS = ["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers"]

setup(ext_modules=[
    # Not a Python module (no PyInit): a plain shared library, preloaded by path.
    Extension("gateway._sockio", sources=["gateway/_sockio.c"], optional=True,
              extra_compile_args=FLAGS),
])
