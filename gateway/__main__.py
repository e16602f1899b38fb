"""`python -m gateway [--host H] [--port P] [--backend URL ...]`; every setting has a flag.
`python -m gateway epp [...]` is `--mode epp`: the endpoint picker of a Gateway API gateway."""

from __future__ import annotations

import sys

from gateway.cli import fail, settings_from_args
from gateway.flow.keys import KeyFileError
from gateway.routing.discovery.base import DiscoveryError
from gateway.server import ListenError, run


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["epp"]:
        args = ["--mode", "epp", *args[1:]]
    settings = settings_from_args(args)
    try:
        if settings.mode == "epp":
            # Imported here: grpcio and xds-protos are the `epp` extra, not every install's.
            from gateway.epp.server import run as run_epp

            run_epp(settings)
        else:
            run(settings)
    except (DiscoveryError, KeyFileError, ListenError) as exc:
        # e.g. kubernetes discovery outside a cluster with no kube config, a keys file that
        # cannot be read or parsed, a port in use: one line naming the setting, no traceback.
        fail(str(exc))


if __name__ == "__main__":
    main()
