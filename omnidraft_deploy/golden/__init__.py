"""Golden files for the Android core: decoding traces (``trace``) and the command that writes
them with the tokenizer vectors (``write``; run as ``python -m omnidraft_deploy.golden``)."""
