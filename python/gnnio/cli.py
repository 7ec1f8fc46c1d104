"""The ``gnnio`` command. ``gnnio bench ...`` runs the benchmark, the same as
``python -m gnnio.bench ...`` (see ``gnnio bench --help``)."""
import argparse
import sys

import gnnio

COMMANDS = {"bench": "gnnio against PyG and torch.sparse on the same graphs and inputs: a table on "
                     "stdout, the results JSON, a markdown table and a plot"}


def main(argv=None):
    """Console entry point; returns the exit status (0), bad input exits through argparse."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "bench":
        from gnnio.bench.__main__ import main as bench_main

        bench_main(argv[1:], prog="gnnio bench")
        return 0
    p = argparse.ArgumentParser(prog="gnnio", description="gnnio's command line. 'gnnio bench ...' "
                                "runs the benchmark, the same as 'python -m gnnio.bench ...'.",
                                epilog="Run 'gnnio COMMAND --help' for a command's options.")
    p.add_argument("--version", action="version", version=f"gnnio {gnnio.__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name, text in COMMANDS.items():
        sub.add_parser(name, help=text, add_help=False)
    p.parse_args(argv)  # -h, --version and unknown commands end here
    p.print_help(sys.stderr)
    return 2


def bench(argv=None):
    """The older ``gnnio-bench`` script: ``gnnio bench`` under its own name."""
    from gnnio.bench.__main__ import main as bench_main

    bench_main(sys.argv[1:] if argv is None else argv, prog="gnnio-bench")
    return 0


if __name__ == "__main__":
    sys.exit(main())
