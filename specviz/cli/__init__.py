"""The command line: python -m specviz <subcommand>."""
