"""The bundle format: the manifest schema (``manifest``, no I/O), reading listed files as a
closed world and hashing them (``files``), the bundle folder on disk (``folder``: read, verify,
stage), crash-safe writes (``atomic``), strict JSON (``strict_json``), per-bundle session state
(``state``) and the graph-call contract (``graph_contract``)."""
