"""Per-GPU-hour prices: the shipped table (``prices.csv``) or the user's own file.

A price file is a CSV with at least the columns ``hardware,usd_per_gpu_hour`` (the shipped one adds
``kind``, ``source`` and ``date`` for every row; ``gpus_per_instance``, optional, is the GPUs a provider rents
together: a deployment is billed for whole instances, 5 GPUs of an 8-GPU instance as 8; empty or absent, each GPU
is billed on its own, pro rata, as the shipped prices are -- most of them an 8-GPU instance's price / 8). Prices are what one GPU of that hardware preset costs for
an hour, in US dollars; the shipped ones are cloud on-demand list prices (one approximate quote, marked
in its ``kind`` column), so a reserved, spot or owned fleet should bring its own (``--prices``).

A bad file stops with one line naming the file, row and field: an unknown preset, a price that is not a
finite number or is negative, a repeated preset, or (checked by :func:`price_of`) a preset the search
needs that has no price.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from pathlib import Path

from blendsim.sim.errors import UserError

SHIPPED_PRICES = Path(__file__).with_name("prices.csv")
REQUIRED = ("hardware", "usd_per_gpu_hour")
# no GPU rents for more than this an hour (list prices of 2026 are $1-$15): a larger figure is a typo, such as cents
MAX_USD_PER_GPU_HOUR = 1_000.0
# the most GPUs one rented instance holds (a GB200 NVL72 rack: 72)
MAX_GPUS_PER_INSTANCE = 72


@dataclass(frozen=True)
class Price:
    """One GPU kind's price."""

    hardware: str  # hardware preset name
    usd_per_gpu_hour: float
    kind: str = ""  # on-demand list, approximate quote, reserved, spot, owned, ... (free text)
    source: str = ""
    date: str = ""
    gpus_per_instance: int = 1  # the GPUs rented together: a deployment is billed for whole instances

    def billed_gpus(self, gpus: int) -> int:
        """The GPUs a deployment of ``gpus`` pays for: whole instances."""
        return -(-int(gpus) // self.gpus_per_instance) * self.gpus_per_instance


@dataclass(frozen=True)
class PriceTable:
    """Prices by hardware preset, and the file they came from."""

    path: Path
    prices: dict  # hardware -> Price

    def price_of(self, hardware: str, where: str = "in the search's --hardware",
                 instead: str | None = None, own: str = "--prices FILE"):
        """The price of ``hardware``; a one-line error when the file has none (``where``: what named the GPU;
        ``instead``: the other way out besides a price, default leaving it out of ``--hardware``)."""
        try:
            return self.prices[hardware]
        except KeyError:
            instead = instead or f"leave {hardware} out of --hardware"
            if self.path == SHIPPED_PRICES:  # the package's own table: the user's prices go in a file of theirs
                raise UserError(f"the shipped price table has no price for {hardware} ({where}): give your own with "
                                f"{own} (columns hardware,usd_per_gpu_hour) or {instead}") from None
            raise UserError(f"{self.path}: no price for {hardware} ({where}); add a row "
                            f"'{hardware},USD_PER_GPU_HOUR' or {instead}") from None

    def cost(self, hardware: str, gpus: int, makespan_s: float, billing_hour: bool = False) -> float:
        """What ``gpus`` GPUs of ``hardware`` cost for ``makespan_s``: :func:`job_cost` over the GPUs billed."""
        p = self.price_of(hardware)
        return job_cost(p.billed_gpus(gpus), p.usd_per_gpu_hour, makespan_s, billing_hour)

    def to_dict(self) -> dict:
        return {"file": str(self.path), "prices": {h: p.__dict__ for h, p in self.prices.items()}}


def read_prices(path: str | Path | None = None) -> PriceTable:
    """Read a price file (``None``: the shipped table)."""
    from blendsim.sim.hardware import PRESETS

    path = Path(path) if path is not None else SHIPPED_PRICES
    try:
        with path.open(newline="", encoding="utf-8-sig") as fh:  # a spreadsheet's "CSV UTF-8" starts with a BOM
            reader = csv.DictReader(fh)
            header = [h.strip() for h in (reader.fieldnames or [])]
            twice = sorted({h for h in header if h and header.count(h) > 1})
            if twice:  # csv.DictReader would keep the last one's values: which column was meant?
                raise UserError(f"{path}: column(s) {', '.join(twice)} appear twice in the header")
            missing = [c for c in REQUIRED if c not in header]
            if missing:
                raise UserError(f"{path}: missing column(s) {', '.join(missing)}; a price file has the columns "
                                f"hardware,usd_per_gpu_hour (source, date, kind, gpus_per_instance optional)")
            rows = []
            for r in reader:
                if None in r and any(str(x).strip() for x in r[None]):  # more cells than the header's columns
                    raise UserError(f"{path} row {reader.line_num}: {len(header) + len(r[None])} cells for the "
                                    f"header's {len(header)} columns")
                rows.append({(k or "").strip(): (v or "").strip() if isinstance(v, str) else "" for k, v in r.items()})
    except OSError as e:
        raise UserError(f"{path}: cannot read the price file ({e.strerror or e})") from None
    except (UnicodeDecodeError, csv.Error) as e:
        raise UserError(f"{path}: not a readable CSV file ({e})") from None
    prices: dict = {}
    for i, r in enumerate(rows, start=2):  # line 1 is the header
        hw, raw = r.get("hardware", ""), r.get("usd_per_gpu_hour", "")
        where = f"{path} row {i}"
        if hw not in PRESETS:
            raise UserError(f"{where}, hardware: {hw!r} is not a hardware preset ({', '.join(PRESETS)})")
        try:
            if "_" in raw:  # Python's float() reads 2_5 as 25; a spreadsheet does not
                raise ValueError
            usd = float(raw)
        except ValueError:
            raise UserError(f"{where}, usd_per_gpu_hour: {raw!r} is not a number") from None
        if not math.isfinite(usd):
            raise UserError(f"{where}, usd_per_gpu_hour: {raw!r} is not a finite number")
        if usd < 0:
            raise UserError(f"{where}, usd_per_gpu_hour: {raw} is negative")
        if usd > MAX_USD_PER_GPU_HOUR:
            raise UserError(f"{where}, usd_per_gpu_hour: {raw} dollars for one GPU for an hour is more than "
                            f"{MAX_USD_PER_GPU_HOUR:,.0f} (cents given as dollars?)")
        if hw in prices:
            raise UserError(f"{where}, hardware: {hw} has a price already (one row per preset)")
        per = r.get("gpus_per_instance", "") or "1"
        if not re.fullmatch(r"[0-9]+", per) or not 1 <= int(per) <= MAX_GPUS_PER_INSTANCE:
            raise UserError(f"{where}, gpus_per_instance: {per!r} is not a whole number of GPUs from 1 to "
                            f"{MAX_GPUS_PER_INSTANCE} (empty: each GPU billed on its own)")
        prices[hw] = Price(hw, usd, r.get("kind", ""), r.get("source", ""), r.get("date", ""), int(per))
    if not prices:
        raise UserError(f"{path}: no prices (a row per GPU: hardware,usd_per_gpu_hour)")
    return PriceTable(path, prices)


def job_cost(gpus: int, usd_per_gpu_hour: float, makespan_s: float, billing_hour: bool = False) -> float:
    """GPUs x hours of the makespan x price; ``billing_hour`` bills every started hour in full."""
    hours = makespan_s / 3600.0
    if billing_hour:
        hours = float(math.ceil(hours))
    return gpus * usd_per_gpu_hour * hours


def run_cost_line(summary: dict) -> str | None:
    """``simulate``'s line for what a run's GPUs cost for its makespan at the shipped on-demand price of its GPU (as
    ``plan`` prices a deployment), where the shipped table has one; None otherwise."""
    p = read_prices().prices.get(str(summary.get("hardware")))
    if p is None or not summary.get("makespan_s") or not summary.get("gpus"):
        return None
    billed = p.billed_gpus(int(summary["gpus"]))
    usd = job_cost(billed, p.usd_per_gpu_hour, float(summary["makespan_s"]))
    return (f"cost ${usd:,.4g}: {billed} GPU(s) x {summary['makespan_s'] / 3600:,.4g} h at ${p.usd_per_gpu_hour:g} "
            f"per {summary['hardware']} GPU-hour, the shipped {p.kind or 'price'}{f' of {p.date}' if p.date else ''} "
            f"(blendsim/plan/prices.csv; yours: blendsim plan --prices, or Result.cost_usd)")


__all__ = ["Price", "PriceTable", "SHIPPED_PRICES", "job_cost", "read_prices", "run_cost_line"]
