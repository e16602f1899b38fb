"""`python -m gateway [--host H] [--port P] [--backend URL ...]`; every setting has a flag."""

from __future__ import annotations

import sys

from gateway.cli import settings_from_args
from gateway.server import run


def main(argv: list[str] | None = None) -> None:
    settings = settings_from_args(sys.argv[1:] if argv is None else argv)
    run(settings)


if __name__ == "__main__":
    main()
