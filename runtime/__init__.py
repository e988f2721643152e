"""Reference runtime (installed as ``omnidraft_deploy.runtime``): run exported bundles on a desktop
exactly as the phone will, behind the core ``CausalLM`` protocol.

Entry points: ``bundle.load_model(path_or_bundle, role)`` (one graph, backend chosen from the
manifest), ``bundle.open_bundle`` (both graphs + mapper + n-gram cache, every check first; a
command opens its bundle once and passes it on), ``run.run_bundle`` / ``run.target_only`` on an
opened bundle, and ``validate.validate_bundle``.
"""

from __future__ import annotations
