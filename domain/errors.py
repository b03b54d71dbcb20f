"""The domain's errors: a small tree that ``app`` maps to OpenAI error JSON in one place."""

from __future__ import annotations

__all__ = ["DomainError", "InvalidInput", "InvariantViolation"]


class DomainError(Exception):
    """Base of every error raised by ``domain``."""


class InvariantViolation(DomainError):
    """An event that the response state machine forbids.

    ``rule`` names the broken invariant (e.g. ``"delta_for_closed_item"``), so tests and logs can
    tell violations apart without parsing the message.
    """

    def __init__(self, rule: str, message: str) -> None:
        super().__init__(f"{rule}: {message}")
        self.rule = rule
        self.message = message


class InvalidInput(DomainError):
    """Request input the domain cannot turn into a prompt; the service answers 400."""

    def __init__(
        self, message: str, *, param: str | None = None, code: str = "invalid_value"
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
