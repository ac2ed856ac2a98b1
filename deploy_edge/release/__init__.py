"""Signed releases: one file that carries an export bundle and a signed manifest of it.

A release is an uncompressed tar file whose members are, in this order::

    manifest.json      the manifest (:class:`~deploy_edge.release.manifest.Manifest`): model,
                       release number, targets, expiry, the bundle's I/O spec and the sha256
                       and size of every bundle file
    manifest.sig       the Ed25519 signature of the exact bytes of manifest.json, as JSON:
                       {"algorithm": "ed25519", "key_id": ..., "signature": <base64>}
    bundle/<files>     the export bundle (:func:`deploy_edge.bundle.files.bundle_files`)

An edge device installs one in three steps, each its own function so that the agent can record
which one refused:

1. :func:`~deploy_edge.release.signature.verify_release`: the signature is by one of the
   device's trusted keys and covers the manifest as it is in the file (Mender's signed
   artifacts);
2. :func:`~deploy_edge.release.manifest.check_policy`: the release has not expired and is not
   below the device's floor, the highest release it ever installed (TUF: expiring metadata, no
   silent downgrade, a rollback does not lower the bar); ``force`` overrides and reports what
   it overrode;
3. :func:`~deploy_edge.release.payload.extract_release`: unpacks into a fresh directory,
   accepting only regular files inside ``bundle/`` whose sha256 the manifest lists (PEP 706's
   ``data`` filter plus checks of its own), none missing and none extra, and a model whose
   external data stays inside the bundle (the ONNX external-data path traversal CVEs).

What a release can write to a device's disk is bounded by its signature: the manifest signs
every bundle file's size, a member whose tar header says otherwise is refused before a byte of
it is written, the copy stops at the declared size, and the sizes must add up to no more than
the device's cap. Compressed releases are refused (a few KiB of gzip can unpack to GiB): the
file's own size bounds what it unpacks to.

Every refusal is a :class:`~deploy_edge.release.header.ReleaseError` whose ``reason`` is a
short code the agent reports and whose message names the file, member or value. Uses the
standard library, ``cryptography`` and (to read the model's external data references) ``onnx``;
nothing of the training stack. The format by part, as Mender splits its artifact format:

- :mod:`deploy_edge.release.header`: the format's name and version, member names, refusal
  reasons (``ReleaseError``), reading the tar safely.
- :mod:`deploy_edge.release.manifest`: the ``Manifest`` record, its signed bytes and parsing,
  ``read_manifest``, the install policy (``check_policy``, ``has_expired``).
- :mod:`deploy_edge.release.signature`: signing a bundle into a release (``write_release``) and
  verifying one against trusted keys (``verify_release``).
- :mod:`deploy_edge.release.payload`: extracting the bundle with every member checked
  (``extract_release``).
"""
