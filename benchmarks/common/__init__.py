"""What every benchmark shares (see ``benchmarks/__init__.py``): ``pair`` (models, vocabularies,
prompts, decoders), ``timer`` (round-robin timing), ``report`` (JSON -> Markdown + PNG, with the
run's command, revision, machine and load), ``peers`` (other engines timed beside ours) and
``evaluate`` (a drafter's acceptance and teacher-forced top-1 per task)."""
