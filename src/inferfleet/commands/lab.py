"""`inferfleet lab`: the local lab (containers as hosts, SeaweedFS as S3)."""

from __future__ import annotations

import typer
from rich.console import Console

from inferfleet.lab import services
from inferfleet.lab.image import ensure_node_image

app = typer.Typer(help="The local lab: node containers, S3 and a tiny model.", no_args_is_help=True)
console = Console()
LAB_NAME = "inferfleet-lab"


@app.command()
def up() -> None:
    """Build (or reuse) the node image and start the lab's services."""
    image = ensure_node_image(log=console.print)
    lab = services.up(LAB_NAME, image)
    console.print(f"node image {image}; S3 at {lab.s3_endpoint_host} ({lab.s3_endpoint_nodes})")


@app.command()
def down() -> None:
    """Remove every container and network the lab made, and nothing else."""
    removed = services.down(LAB_NAME)
    console.print(f"removed {len(removed)} lab object(s)")
