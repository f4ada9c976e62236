"""The one exception the planner raises for bad input a person can fix."""


class PlannerError(Exception):
    """A model, hardware description or target the planner cannot use.

    The message says what is wrong and what to change; callers show it as is.
    """
