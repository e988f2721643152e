"""From names to things: the one model loader, a preset (plus optional weights) to an eager model
(``load``); the inputs of ``omnidraft-export`` resolved and checked before any export step
(``export_inputs``: weights with no preset are their own spec, ``weights_spec``; the output folder,
``out_dir``; the KV slots, ``context``); a preset pair built into eager models, tokenizers and
mapper (``pair``)."""
