"""What an exported graph is checked against: logit parity with eager PyTorch (``parity``) and
the target-only output recorded at export (``expected``)."""
