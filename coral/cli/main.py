"""Entry point of the `coral` command."""

from __future__ import annotations

import logging

import typer

from coral import __version__
from coral.cli import (
    catalog_cmd,
    evaluate_cmd,
    perf_cmd,
    plan_cmd,
    profile_cmd,
    serve_cmd,
    simulate_cmd,
    templates_cmd,
)

app = typer.Typer(
    name="coral",
    help="Plan, simulate and serve many LLMs on heterogeneous cloud GPUs at the lowest cost "
    "that meets every latency SLO.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(catalog_cmd.app, name="catalog")
app.add_typer(perf_cmd.app, name="perf")
app.command("profile")(profile_cmd.profile)
app.add_typer(templates_cmd.app, name="templates")
app.command("plan")(plan_cmd.plan)
app.command("demo")(plan_cmd.demo)
app.command("adapt")(plan_cmd.adapt)
app.command("simulate")(simulate_cmd.simulate)
app.command("serve")(serve_cmd.serve)
app.command("evaluate")(evaluate_cmd.evaluate)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"coral {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log progress details."),
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version."
    ),
) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )


if __name__ == "__main__":
    app()
