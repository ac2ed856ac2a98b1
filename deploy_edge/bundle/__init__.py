"""The export bundle: the directory ``robo-pipe export`` writes and every consumer reads.

- :mod:`deploy_edge.bundle.layout`: the bundle's file names (``policy.onnx``, ``io_spec.json``,
  ...) and its bundle-relative paths.
- :mod:`deploy_edge.bundle.io_spec`: the I/O spec (``IOSpec`` and its records), its versioned
  format, ``read_io_spec`` / ``write_io_spec``.
- :mod:`deploy_edge.bundle.files`: which files a bundle is, its checksums (``verify_bundle``),
  copying one, the model's hash.
- :mod:`deploy_edge.bundle.external_data`: every graph's ONNX external data stays a listed file
  of the bundle.
"""
