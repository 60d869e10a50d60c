"""The README's table of limits says what the code enforces (it once gave the workshop 40,000 for 48,000)."""

import re
from pathlib import Path

from stagewise import limits

README = Path(__file__).resolve().parent.parent / "README.md"


def number(text: str) -> int:
    """'2,000,000' -> 2000000; '2^28' -> 2**28; '64 MiB' -> 64 * 2**20."""
    text = text.replace(",", "").strip()
    if m := re.fullmatch(r"(\d+)\^(\d+)", text):
        return int(m[1]) ** int(m[2])
    if m := re.fullmatch(r"(\d+) MiB", text):
        return int(m[1]) * 2**20
    return int(text)


def test_every_limit_is_in_the_readme_with_its_default():
    rows = dict(re.findall(r"^\| `(STAGEWISE_MAX_\w+)` \| ([^|]+) \|", README.read_text(), re.M))
    assert {lim.env: lim.default for lim in limits.ALL.values()} == {env: number(v) for env, v in rows.items()}
