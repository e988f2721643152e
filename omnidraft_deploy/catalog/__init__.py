"""The catalogue: what this project knows about, as data: model presets (``presets``), export
backends and their quantisation recipes (``backends``), the shipped prompt set (``prompts``) and the
pinned offline assets (``assets``). The bottom room: it imports no other room."""
