"""`inferfleet model`: versions of model weights in S3-compatible object storage."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

app = typer.Typer(help="Model weights: content-verified versions in object storage.",
                  no_args_is_help=True)
console = Console(stderr=True)


@app.callback()
def _model() -> None:
    """Model weights: content-verified versions in S3-compatible object storage."""


def _fail(message: str) -> None:
    console.print(f"[red]error:[/] {message}", soft_wrap=True, highlight=False)
    raise typer.Exit(1)


@app.command()
def publish(
    local_dir: Path = typer.Argument(..., help="Folder holding the model's files."),
    url: str = typer.Argument(..., help="s3://BUCKET/PREFIX/NAME/VERSION"),
    endpoint_url: str = typer.Option(None, "--endpoint-url", envvar="AWS_ENDPOINT_URL",
                                     help="S3 endpoint (AWS when unset)."),
    access_key: str = typer.Option(None, "--access-key", envvar="AWS_ACCESS_KEY_ID",
                                   show_default=False),
    secret_key: str = typer.Option(None, "--secret-key", envvar="AWS_SECRET_ACCESS_KEY",
                                   show_default=False),
    region: str = typer.Option("us-east-1", "--region", envvar="AWS_DEFAULT_REGION"),
    name: str = typer.Option(None, "--name", help="Model name (default: from the URL)."),
    version: str = typer.Option(None, "--version",
                                help="Model version (default: from the URL)."),
    force: bool = typer.Option(False, "--force", help="Replace a version already published."),
    concurrency: int = typer.Option(8, "--concurrency", min=1, help="Parallel uploads."),
    part_size_mb: int = typer.Option(64, "--part-size-mb", min=5,
                                     help="Multipart part size (MiB)."),
) -> None:
    """Hash LOCAL_DIR, upload its files in parallel, then manifest.json (last)."""
    from botocore.exceptions import BotoCoreError, ClientError

    from inferfleet.publish import PublishError
    from inferfleet.publish import publish as do_publish

    try:
        result = do_publish(local_dir, url, endpoint_url=endpoint_url, access_key=access_key,
                            secret_key=secret_key, region=region, force=force, name=name,
                            version=version, concurrency=concurrency,
                            part_size_mb=part_size_mb, log=lambda m: console.print(m))
    except PublishError as exc:
        _fail(str(exc))
    except ClientError as exc:
        err = exc.response.get("Error", {})
        _fail(f"the object store refused {exc.operation_name}: {err.get('Code', '?')} "
              f"{err.get('Message', '')}".rstrip())
    except BotoCoreError as exc:
        _fail(f"object store: {exc}")
    except OSError as exc:
        _fail(f"{exc.filename or local_dir}: {exc.strerror or exc}")
    m = result.manifest
    total = sum(f["size"] for f in m["files"])
    console.print(f"published {m['name']}/{m['version']} to {result.location.url}: "
                  f"{result.files_uploaded} files, {total / 1024 ** 2:.1f} MiB in "
                  f"{result.seconds:.1f} s", highlight=False)
    typer.echo(m["digest"])  # stdout: the digest alone, for scripts
