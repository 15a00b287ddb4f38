"""The standard 5-field cron syntax (minute hour day-of-month month day-of-week), read in
a time zone: pure, no I/O.

Each field takes ``*``, a number, a range ``a-b``, a step ``*/n`` or ``a-b/n``, and lists
of those (``1,15,30-40/5``); months and weekdays also take their English three-letter
names, and day-of-week 7 is Sunday like 0. As in Vixie cron, when both day fields are
restricted a day matches either. The due times are wall-clock times of ``timezone``
(``zoneinfo``): a time a DST change skips is run at the shifted instant, a repeated one once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cardbus.eventstore.errors import InvalidSchedule

__all__ = ["Cron", "parse_cron", "zone"]

_MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
_DAYS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]
# (name, low, high, names) of the five fields
_FIELDS: tuple[tuple[str, int, int, list[str]], ...] = (
    ("minute", 0, 59, []),
    ("hour", 0, 23, []),
    ("day-of-month", 1, 31, []),
    ("month", 1, 12, _MONTHS),
    ("day-of-week", 0, 7, _DAYS),
)
_SEARCH_DAYS = 366 * 5  # "0 0 29 2 *" needs up to 8 years in a rare case; 5 is plenty else


def zone(name: str) -> ZoneInfo:
    """The time zone ``name`` (IANA, e.g. ``Europe/Paris``); ``InvalidSchedule`` if unknown."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as e:
        raise InvalidSchedule(f"unknown time zone {name!r}") from e


@dataclass(frozen=True, slots=True)
class Cron:
    """A parsed expression: the allowed values of each field."""

    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    any_day: bool  # day-of-month was "*"
    any_weekday: bool  # day-of-week was "*"

    def _day_matches(self, d: datetime) -> bool:
        dom = d.day in self.days
        dow = (d.isoweekday() % 7) in self.weekdays
        if self.any_day or self.any_weekday:
            return dom and dow
        return dom or dow

    def next_after(self, after: float, tz: ZoneInfo) -> float:
        """The first due time strictly after ``after`` (epoch seconds), as epoch seconds."""
        local = datetime.fromtimestamp(after, tz).replace(tzinfo=None)
        t = local.replace(second=0, microsecond=0) + timedelta(minutes=1)
        end = t + timedelta(days=_SEARCH_DAYS)
        while t < end:
            if t.month not in self.months:
                t = (t.replace(day=1) + timedelta(days=32)).replace(day=1, hour=0, minute=0)
            elif not self._day_matches(t):
                t = (t + timedelta(days=1)).replace(hour=0, minute=0)
            elif t.hour not in self.hours:
                t = (t + timedelta(hours=1)).replace(minute=0)
            elif t.minute not in self.minutes:
                t += timedelta(minutes=1)
            else:
                due = t.replace(tzinfo=tz).timestamp()
                if due > after:  # a wall time before a DST shift can map back in time
                    return due
                t += timedelta(minutes=1)
        raise InvalidSchedule("the cron expression matches no time in five years")


def parse_cron(expr: str) -> Cron:
    """``Cron`` of a 5-field expression; ``InvalidSchedule`` naming the bad field."""
    parts = expr.split()
    if len(parts) != 5:
        raise InvalidSchedule(f"cron {expr!r}: 5 fields expected, got {len(parts)}")
    values = [_field(p, *spec) for p, spec in zip(parts, _FIELDS, strict=True)]
    weekdays = frozenset(0 if d == 7 else d for d in values[4])
    return Cron(
        minutes=values[0],
        hours=values[1],
        days=values[2],
        months=values[3],
        weekdays=weekdays,
        any_day=parts[2] == "*",
        any_weekday=parts[4] == "*",
    )


def _field(text: str, name: str, low: int, high: int, names: list[str]) -> frozenset[int]:
    out: set[int] = set()
    for item in text.split(","):
        body, _, step_text = item.partition("/")
        step = _number(step_text, name, names=[]) if step_text else 1
        if step < 1:
            raise InvalidSchedule(f"cron {name}: step {step_text!r} must be at least 1")
        if body == "*":
            first, last = low, high
        elif "-" in body:
            a, _, b = body.partition("-")
            first, last = _number(a, name, names), _number(b, name, names)
        else:
            first = _number(body, name, names)
            last = high if step_text else first
        if not (low <= first <= high and low <= last <= high) or first > last:
            raise InvalidSchedule(f"cron {name}: {item!r} outside {low}-{high}")
        out.update(range(first, last + 1, step))
    return frozenset(out)


def _number(text: str, name: str, names: list[str]) -> int:
    if text.lower() in names:
        return names.index(text.lower()) + (1 if name == "month" else 0)
    if not text.isdigit():
        raise InvalidSchedule(f"cron {name}: {text!r} is not a number")
    return int(text)
