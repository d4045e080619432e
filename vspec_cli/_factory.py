"""One factory for every (sub-)app so the house settings are the same everywhere."""

from __future__ import annotations

import typer

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def typer_factory(help: str, **kwargs) -> typer.Typer:
    return typer.Typer(
        help=help,
        no_args_is_help=True,
        context_settings=CONTEXT_SETTINGS,
        pretty_exceptions_enable=False,
        rich_markup_mode="rich",
        **kwargs,
    )
