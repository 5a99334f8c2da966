"""python -m engine {generate,serve,bench}: the command line is engine/entrypoints/cli.py."""
import sys

from engine.entrypoints.cli import main

sys.exit(main())
