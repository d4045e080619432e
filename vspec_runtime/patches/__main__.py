"""`python -m vspec_runtime.patches > docs/patches.md`."""

from vspec_runtime.patches import render_markdown

print(render_markdown(), end="")
