"""What every benchmark shares (see ``benchmarks/__init__.py``): ``pair`` (models, vocabularies,
prompts, decoders), ``timer`` (round-robin timing), ``report`` (JSON -> Markdown + PNG, with the
run's command, revision, machine and load) and ``peers`` (other engines timed beside ours)."""
