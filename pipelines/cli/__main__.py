"""``python -m pipelines.cli``: the same as the ``robo-pipe`` command."""

from pipelines.cli import main

main()
