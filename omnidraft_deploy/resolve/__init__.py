"""From names to things: the one model loader, a preset (plus optional weights) to an eager model
(``load``); the inputs of ``omnidraft-export`` resolved and checked before any export step
(``export_inputs``); a preset pair built into eager models, tokenizers and mapper (``pair``)."""
