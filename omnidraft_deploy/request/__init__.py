"""A run request and what it prints: the wire format between ``omnidraft run`` and ``omnidraft
serve`` (``protocol``), and the text streamed as tokens commit plus the ``--stats`` lines
(``streaming``). Pure modules below ``runtime`` and ``cli``: the runtime's session answers
requests, the CLI sends them, the golden traces record the streamed text."""
