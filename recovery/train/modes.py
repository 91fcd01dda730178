"""Which lose-nothing recovery modes a job uses: msrun's ``MS_ENABLE_TFT`` syntax, ``{TTP:1,UCE:1,ARF:1}``.
TTP: survivors save last-words checkpoints; UCE: in-place recovery from a device error; ARF: a relaunched
rank takes a healthy replica's state. A mode not named is off; msrun's Ascend-only ones are ignored."""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["TftModes", "parse_enable_tft", "ALL_ON"]

_KNOWN = ("TTP", "UCE", "ARF")
_ASCEND_ONLY = ("TSP", "RSC", "HCCE", "TRE")
_ITEM = re.compile(r"^\s*(?P<key>[A-Za-z]+)\s*:\s*(?P<value>[01])\s*$")


@dataclass(frozen=True)
class TftModes:
    """The switches, one per mode."""

    ttp: bool
    uce: bool
    arf: bool


ALL_ON = TftModes(ttp=True, uce=True, arf=True)


def parse_enable_tft(text: str | None) -> TftModes:
    """Read an ``MS_ENABLE_TFT`` value; ``None`` or an empty string gives :data:`ALL_ON`.

    Raises ValueError when the value is not ``{KEY:0|1,...}`` with known keys.
    """
    if text is None or not text.strip():
        return ALL_ON
    body = text.strip()
    if not (body.startswith("{") and body.endswith("}")):
        raise ValueError(f"MS_ENABLE_TFT must look like '{{TTP:1,UCE:1,ARF:1}}', got {text!r}")
    switches: dict[str, bool] = {}
    for item in filter(str.strip, body[1:-1].split(",")):
        match = _ITEM.match(item)
        if match is None:
            raise ValueError(f"MS_ENABLE_TFT: {item.strip()!r} is not KEY:0 or KEY:1")
        key = match["key"].upper()
        if key not in _KNOWN + _ASCEND_ONLY:
            raise ValueError(f"MS_ENABLE_TFT: unknown mode {key!r} (known: {', '.join(_KNOWN)})")
        switches[key] = match["value"] == "1"
    return TftModes(**{key.lower(): switches.get(key, False) for key in _KNOWN})
