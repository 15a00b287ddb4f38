"""A demo agent that asks a person a typed question before it pays (``AskPerson``).

``cardbus.agents.demo:Payer`` offers ``pay``: given a ``payee``, it asks how much and in
which currency (:class:`Amount`: a number, and ``EUR`` or ``USD``), then answers with the
payment it would make. The docs' "Answer a question" walk-through and the tests of every
door (console, command line, A2A) run it.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from cardbus.agents.agent import Agent, Capability, TaskContext
from cardbus.agents.cards import TaskCard
from cardbus.agents.questions import AskPerson

__all__ = ["Amount", "Payee", "Payer", "Payment"]


class Payee(msgspec.Struct):
    payee: str


class Amount(msgspec.Struct):
    amount: float
    currency: Literal["EUR", "USD"]


class Payment(msgspec.Struct):
    text: str
    payee: str
    amount: float
    currency: str


class Payer(Agent):
    agent_id = "payer"
    description = "Pays a payee the amount a person gives."
    capabilities = [Capability("pay", Payee, Payment, "pay someone, once a person says how much")]

    async def handle(self, task: TaskCard, inputs: Payee, ctx: TaskContext) -> Payment:
        if task.supplement is None:  # first attempt: ask; the next one has the answer
            raise AskPerson(f"How much should {inputs.payee} be paid, in which currency?", Amount)
        got = msgspec.convert(task.supplement, Amount)
        text = f"pay {got.amount:g} {got.currency} to {inputs.payee}"
        return Payment(text=text, payee=inputs.payee, amount=got.amount, currency=got.currency)
