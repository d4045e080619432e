"""The `vspec` command. Never imported inside vLLM processes."""
