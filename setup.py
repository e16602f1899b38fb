"""The one build step pyproject.toml cannot declare stably: the relay's C extension.

gateway/speedups.py says why it exists. `optional=True`: where it does not compile (no C compiler),
the install goes on and the gateway runs the extension's Python twins.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension(
    "gateway._speedups",
    sources=["gateway/_speedups.c"],
    optional=True,
    extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter",
                        "-Wno-missing-field-initializers"],
)])
