"""The `vspec` commands, one module per command group; each has `register(app)`, wired in vspec_cli/app.py."""
