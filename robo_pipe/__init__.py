"""robo-pipe's kernel: what every layer may import (errors, typed records). No dependencies
beyond the standard library; the edge runtime (``deploy_edge``) imports it too."""
