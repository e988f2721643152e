"""Running graphs on this machine: ONNX Runtime sessions (``onnx_host``), transparent huge pages
under their weights (``hugepages``) and the measured cost profile of a bundle (``profile``)."""
