"""From names to things: the inputs of ``omnidraft-export`` resolved and checked before any
export step (``export_inputs``) and a preset pair built into eager models, tokenizers and mapper
(``pair``)."""
