"""The `inferfleet` command: one sub-command per life-cycle action."""

from __future__ import annotations

import typer

from inferfleet.commands import (
    deploy,
    doctor,
    lab,
    migrate,
    model,
    plan,
    rollout,
    scale,
    status,
    verify,
)

app = typer.Typer(
    help="Provision and operate LLM inference fleets (vLLM behind HAProxy/Nginx).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(lab.app, name="lab")
app.add_typer(model.app, name="model")
app.command("plan")(plan.plan_command)
app.command("deploy")(deploy.deploy)
app.command("status")(status.status)
app.command("verify")(verify.verify)
app.command("rollout")(rollout.rollout)
app.command("rollback")(rollout.rollback)
app.command("scale")(scale.scale)
app.command("migrate")(migrate.migrate)
app.command("doctor")(doctor.doctor)

if __name__ == "__main__":
    app()
