"""Address parts that follow from other visible address parts (grounding of postal codes).

A US address is usually said with its state written out ("101 Highway, New York, 10001") while
the tools take the two-letter code (``NY``) and the country (``USA``).  These are the same
facts in the tools' spelling, not made-up values: a state code is grounded when the state's
name is visible, and ``USA`` when the call's own address has a US state code.
"""

from __future__ import annotations

from typing import Any

from cast_rl.critique.context import Visible, leaves

US_STATES = {
    "AL": "alabama", "AK": "alaska", "AZ": "arizona", "AR": "arkansas", "CA": "california",
    "CO": "colorado", "CT": "connecticut", "DE": "delaware", "DC": "district of columbia",
    "FL": "florida", "GA": "georgia", "HI": "hawaii", "ID": "idaho", "IL": "illinois",
    "IN": "indiana", "IA": "iowa", "KS": "kansas", "KY": "kentucky", "LA": "louisiana",
    "ME": "maine", "MD": "maryland", "MA": "massachusetts", "MI": "michigan", "MN": "minnesota",
    "MS": "mississippi", "MO": "missouri", "MT": "montana", "NE": "nebraska", "NV": "nevada",
    "NH": "new hampshire", "NJ": "new jersey", "NM": "new mexico", "NY": "new york",
    "NC": "north carolina", "ND": "north dakota", "OH": "ohio", "OK": "oklahoma", "OR": "oregon",
    "PA": "pennsylvania", "RI": "rhode island", "SC": "south carolina", "SD": "south dakota",
    "TN": "tennessee", "TX": "texas", "UT": "utah", "VT": "vermont", "VA": "virginia",
    "WA": "washington", "WV": "west virginia", "WI": "wisconsin", "WY": "wyoming",
}
_US = frozenset({"USA", "US", "UNITED STATES", "UNITED STATES OF AMERICA"})


def derived_address_part(path: str, value: Any, kwargs: dict[str, Any], visible: Visible) -> bool:
    """Whether an argument is an address part that the visible address parts imply."""
    key = path.split(".")[-1]
    if not isinstance(value, str):
        return False
    text = value.strip().upper()
    if key == "state" and text in US_STATES:
        return visible.contains_text(US_STATES[text])
    if key == "country" and text in _US:
        return any(
            p.split(".")[-1] == "state" and isinstance(v, str) and v.strip().upper() in US_STATES
            for p, v in leaves(kwargs)
        )
    return False
