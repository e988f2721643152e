"""Reference runtime (installed as ``omnidraft_deploy.runtime``): run exported bundles on a desktop
exactly as the phone will, behind the core ``CausalLM`` protocol.

Entry points: ``bundle.load_model(path_or_bundle, role)`` (one graph, backend chosen from the
manifest), ``bundle.open_bundle`` (both graphs + mapper + n-gram cache, every check first),
``validate.validate_bundle`` and ``validate.run_bundle``.
"""

from __future__ import annotations
