"""robo-pipe's kernel: what every layer may import (errors, typed records, output locks, name
slugs, where the home is and how files kept in it name its paths: :mod:`robo_pipe.home`).
Besides the standard library it needs only ``filelock`` and ``python-slugify``; the edge
runtime (``deploy_edge``) imports it too."""
